"""``fa-images export github``: a GitHub Actions workflow that runs ``fa-images build`` per job.

Each build job runs ``fa-images build --only ID...`` for its entries on a runner with Docker and
uploads its wheels, manifest, report and logs as an artifact; a final job downloads them all and
runs ``fa-images dist merge`` into one dist/. Jobs hold a tuple of entries, so grouping several
entries into one job (one compile for several Pythons) changes ``job_entries`` only.
Secrets are written as ``${{ secrets.NAME }}`` references, never as values. Those references
and ``${{ !cancelled() }}`` are the only expressions in the file: every flag, path and matrix
value that reaches it is checked against its grammar first, so none can add one, end a comment
or a line, or hand ``gh`` an option.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import yaml

from ...config import grammar
from ...config.matrix import Entry
from ...errors import UsageError
from . import slug

ARTIFACT_PREFIX = "fa-images-"
CHECKOUT = "actions/checkout@v4"
SETUP_PYTHON = "actions/setup-python@v5"
UPLOAD = "actions/upload-artifact@v4"
DOWNLOAD = "actions/download-artifact@v4"
LOGIN = "docker/login-action@v3"


@dataclass(frozen=True, kw_only=True)
class GithubOptions:
    matrix_file: str
    runs_on: tuple[str, ...] = ("ubuntu-latest",)
    merge_runs_on: tuple[str, ...] = ("ubuntu-latest",)
    timeout_minutes: int = 360
    python: str = "3.11"
    install: str = "."  # what `pip install` gets to provide the fa-images command
    push: bool = False
    registry_username_secret: str = "REGISTRY_USERNAME"
    registry_password_secret: str = "REGISTRY_TOKEN"
    release: str | None = None  # a GitHub release tag the merged wheels are uploaded to

    def check(self) -> None:
        """Every flag and path that reaches the workflow, against its own grammar (config/grammar.py)."""
        for flag, labels in (("--runs-on", self.runs_on), ("--merge-runs-on", self.merge_runs_on)):
            if not labels:
                raise UsageError(f"{flag} needs at least one runner label")
            _refuse(flag, labels, grammar.runner_label)
        _refuse("--registry-username-secret", [self.registry_username_secret], grammar.secret_name)
        _refuse("--registry-password-secret", [self.registry_password_secret], grammar.secret_name)
        _refuse("--matrix", [self.matrix_file], grammar.repo_path)
        _refuse("--python", [self.python], grammar.setup_python)
        _refuse("--install", [self.install], grammar.install_spec)
        if self.release is not None:
            _refuse("--release", [self.release], grammar.git_tag)
        if not 1 <= self.timeout_minutes <= 43200:
            raise UsageError(f"--timeout-minutes {self.timeout_minutes} must be between 1 and 43200 (30 days)")


def _refuse(flag: str, values: Iterable[str], check: Callable[[str], str | None]) -> None:
    for value in values:
        problem = check(value) or grammar.generated_value(value)
        if problem:
            raise UsageError(f"{flag} {problem}")


def job_entries(entries: tuple[Entry, ...]) -> list[tuple[str, tuple[Entry, ...]]]:
    """(job id, its entries): one entry per job for now."""
    return [("build-" + slug(e.id), (e,)) for e in entries]


def registry_of(image: str) -> str:
    """The registry host of an image reference, as `docker login` wants it."""
    first = image.split("/", 1)[0]
    if "/" in image and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def _secret(name: str) -> str:
    return "${{ secrets." + name + " }}"


def _install_steps(opts: GithubOptions) -> list[dict]:
    return [
        {"uses": CHECKOUT},
        {"uses": SETUP_PYTHON, "with": {"python-version": opts.python}},
        {"name": "Install fa-images", "run": f"python -m pip install {shlex.quote(opts.install)}"},
    ]


def _build_job(job_id: str, entries: tuple[Entry, ...], opts: GithubOptions) -> dict:
    steps = _install_steps(opts)
    if opts.push:
        for registry in sorted({registry_of(e.image) for e in entries}):
            steps.append(
                {
                    "name": f"Log in to {registry}",
                    "uses": LOGIN,
                    "with": {
                        "registry": registry,
                        "username": _secret(opts.registry_username_secret),
                        "password": _secret(opts.registry_password_secret),
                    },
                }
            )
    command = ["fa-images", "build", "--matrix", opts.matrix_file, "--only", *(e.id for e in entries)]
    command += ["--dist", "dist", "--log-dir", "logs", "--report", "report.json"] + (["--push"] if opts.push else [])
    steps.append({"name": "Build, check and export", "run": shlex.join(command)})
    steps.append(
        {
            "name": "Upload wheels, manifest, report and logs",
            "if": "always()",
            "uses": UPLOAD,
            "with": {
                "name": ARTIFACT_PREFIX + job_id,
                "path": "dist/*.whl\ndist/manifest.json\nreport.json\nlogs/\n",
                "if-no-files-found": "warn",
            },
        }
    )
    job: dict = {
        "name": ", ".join(e.id for e in entries),
        "runs-on": list(opts.runs_on),
        "timeout-minutes": opts.timeout_minutes,
    }
    if opts.push:
        job["permissions"] = {"contents": "read", "packages": "write"}
    job["steps"] = steps
    return job


def _merge_job(needs: list[str], opts: GithubOptions) -> dict:
    steps = _install_steps(opts)
    steps += [
        {
            "name": "Download the wheels of every build job",
            "uses": DOWNLOAD,
            "with": {"pattern": ARTIFACT_PREFIX + "build-*", "path": "artifacts"},
        },
        {"name": "Verify and merge into one dist/", "run": "fa-images dist merge artifacts --dist dist"},
        {
            "name": "Upload dist/ (wheels, manifest.json, simple/ index)",
            "uses": UPLOAD,
            "with": {"name": ARTIFACT_PREFIX + "dist", "path": "dist/", "if-no-files-found": "error"},
        },
    ]
    job: dict = {
        "name": "merge wheels into dist/",
        "needs": needs,
        # Merge what did build even when some entries failed; their jobs stay red.
        "if": "${{ !cancelled() }}",
        "runs-on": list(opts.merge_runs_on),
        "timeout-minutes": 30,
    }
    if opts.release:
        job["permissions"] = {"contents": "write"}
        tag = shlex.quote(opts.release)
        steps.append(
            {
                "name": f"Upload the wheels to release {opts.release}",
                "env": {"GH_TOKEN": _secret("GITHUB_TOKEN")},
                # No --clobber: a published wheel is never replaced under the same name.
                "run": f'gh release view {tag} >/dev/null 2>&1 || gh release create {tag} --title {tag} --notes ""\n'
                f"gh release upload {tag} dist/*.whl\n",
            }
        )
    job["steps"] = steps
    return job


def workflow(entries: tuple[Entry, ...], opts: GithubOptions) -> dict:
    opts.check()
    jobs = {job_id: _build_job(job_id, group, opts) for job_id, group in job_entries(entries)}
    jobs["merge"] = _merge_job(list(jobs), opts)
    return {
        "name": "flash-attn wheels and images",
        "on": {"workflow_dispatch": {}},
        "permissions": {"contents": "read"},
        "jobs": jobs,
    }


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render(entries: tuple[Entry, ...], opts: GithubOptions) -> str:
    opts.check()  # the header's comment names the matrix file: checked before it is written anywhere
    header = (
        f"# Generated by `fa-images export github` from {opts.matrix_file}. Do not edit: change the matrix or\n"
        "# the flags and export again. Secrets are referenced by name; their values live in the repository.\n"
    )
    body = yaml.dump(workflow(entries, opts), Dumper=_Dumper, sort_keys=False, width=1000, default_flow_style=False)
    return header + body

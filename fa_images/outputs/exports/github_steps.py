"""What both GitHub Actions workflows are made of: ``export github``'s (github.py), ``--schedule``'s (schedule.py).

Their options and the checks of every flag that reaches a workflow, the actions they use (at
their pins) and the artifacts' prefix, and the steps a job starts with: the checkout, Python and
fa-images; a login to each registry it pushes to. Secrets are written as references
(``secret``), never as values.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ...builder.shards import MAX_SHARDS
from ...config import grammar
from ...errors import UsageError
from . import sharding

ARTIFACT_PREFIX = "fa-images-"
# The actions the workflows use, each at the newest major whose action.yml declares
# `runs: using: node24`: GitHub's runners made Node 24 the default in June 2026 and removed Node 20
# in September 2026. Beside each, the release whose action.yml was read. Node 24 actions need
# runner 2.327.1 or later, on self-hosted runners too.
CHECKOUT = "actions/checkout@v7"  # v7.0.1 (v4: node20)
SETUP_PYTHON = "actions/setup-python@v7"  # v7.0.0 (v5: node20)
UPLOAD = "actions/upload-artifact@v7"  # v7.0.0 (v5: node20)
DOWNLOAD = "actions/download-artifact@v8"  # v8.0.1 (v6: node20; v8 fails a download whose digest differs)
LOGIN = "docker/login-action@v4"  # v4.1.0 (v3: node20)
COSIGN = "sigstore/cosign-installer@v3"  # cosign 2.x on the runner, for keyless signing (--sign keyless)
ACTIONS = (CHECKOUT, SETUP_PYTHON, UPLOAD, DOWNLOAD, LOGIN, COSIGN)  # every `uses:` a workflow may hold

# GitHub runs at most 256 jobs of one matrix; a group's shards are one matrix.
MAX_MATRIX_JOBS = 256


@dataclass(frozen=True, kw_only=True)
class GithubOptions:
    matrix_file: str
    runs_on: tuple[str, ...] = ("ubuntu-latest",)
    merge_runs_on: tuple[str, ...] = ("ubuntu-latest",)
    timeout_minutes: int = 360
    # The runner's size, which the build jobs' compile must fit within timeout_minutes (runner_fit.py).
    runner_cpus: int = 4
    runner_memory_gib: int = 16
    python: str = "3.11"
    install: str = "."  # what `pip install` gets to provide the fa-images command (this_install.py)
    push: bool = False
    # "keyless": the build jobs sign what they push, and the merge job the wheels, with the job's
    # OIDC identity (cosign through Fulcio and Rekor); None: nothing signed in the workflow.
    sign: str | None = None
    registry_username_secret: str = "REGISTRY_USERNAME"
    registry_password_secret: str = "REGISTRY_TOKEN"
    release: str | None = None  # a GitHub release tag the merged wheels are uploaded to
    shards: int = 1  # 1: each entry compiles in its own build job, no split
    # --schedule CRON: refresh the table, build what is not current at `published`, publish (schedule.py)
    schedule: str | None = None
    published: str | None = None  # the index's URL (GitHub Pages), where the workflow publishes it
    table: str = "compat.yaml"  # the repository's compat table, which the scheduled run refreshes

    def check(self) -> None:
        """Every flag and path that reaches the workflow, against its own grammar (config/grammar.py)."""
        limit = min(MAX_SHARDS, MAX_MATRIX_JOBS)
        sharding.check_count(
            self.shards, most=limit, why=f" (GitHub runs at most {MAX_MATRIX_JOBS} jobs of one matrix)"
        )
        for flag, labels in (("--runs-on", self.runs_on), ("--merge-runs-on", self.merge_runs_on)):
            if not labels:
                raise UsageError(f"{flag} needs at least one runner label")
            _refuse(flag, labels, grammar.runner_label)
        _refuse("--registry-username-secret", [self.registry_username_secret], grammar.secret_name)
        _refuse("--registry-password-secret", [self.registry_password_secret], grammar.secret_name)
        _refuse("--matrix", [self.matrix_file], grammar.repo_path)
        _refuse("--python", [self.python], grammar.setup_python)
        _refuse("--install", [self.install], grammar.install_spec)
        if self.sign not in (None, "keyless"):
            raise UsageError(
                f"--sign {self.sign!r}: the workflow signs keyless only (a key never reaches a runner's disk)"
            )
        if self.sign is not None and self.schedule is not None:
            raise UsageError("--sign keyless goes with the build workflow; the scheduled one does not sign yet")
        if self.release is not None:
            _refuse("--release", [self.release], grammar.git_tag)
        if self.schedule is not None:
            self._check_schedule()
        elif self.published is not None:
            raise UsageError("--published goes with --schedule (a plain export's jobs build every entry)")
        if not 1 <= self.timeout_minutes <= 43200:
            raise UsageError(f"--timeout-minutes {self.timeout_minutes} must be between 1 and 43200 (30 days)")

    def _check_schedule(self) -> None:
        _refuse("--schedule", [self.schedule or ""], grammar.cron)
        if self.shards > 1:
            raise UsageError(
                "--schedule takes no --shards: a scheduled run learns its entries when it runs, "
                "and shards are planned at export"
            )
        if self.published is None:
            raise UsageError("--schedule needs --published URL: where the index is published (GitHub Pages)")
        if not self.push:
            raise UsageError(
                "--schedule needs --push: a runner starts with an empty engine, and an image that is not in "
                "the registry is built again on every run"
            )
        _refuse("--published", [self.published], grammar.public_url)
        _refuse("--table", [self.table], grammar.repo_path)
        if self.table.startswith("/") or ".." in self.table.split("/"):
            raise UsageError(f"--table {self.table!r} must be a path inside the repository, such as compat.yaml")


def _refuse(flag: str, values: Iterable[str], check: Callable[[str], str | None]) -> None:
    for value in values:
        if not isinstance(value, str):  # argparse gives `--flag=--` as [] (it reads `--` as the end of options)
            raise UsageError(f"{flag} takes one value, not {value!r} (`--` is not one)")
        problem = check(value) or grammar.generated_value(value)
        if problem:
            raise UsageError(f"{flag} {problem}")


def registry_of(image: str) -> str:
    """The registry host of an image reference, as `docker login` wants it."""
    first = image.split("/", 1)[0]
    if "/" in image and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def secret(name: str) -> str:
    return "${{ secrets." + name + " }}"


def install_steps(opts: GithubOptions) -> list[dict]:
    return [
        {"uses": CHECKOUT},
        {"uses": SETUP_PYTHON, "with": {"python-version": opts.python}},
        {"name": "Install fa-images", "run": f"python -m pip install {shlex.quote(opts.install)}"},
    ]


def login_steps(images: list[str], opts: GithubOptions) -> list[dict]:
    """A login to each registry the images are pushed to, with the two secrets."""
    return [
        {
            "name": f"Log in to {registry}",
            "uses": LOGIN,
            "with": {
                "registry": registry,
                "username": secret(opts.registry_username_secret),
                "password": secret(opts.registry_password_secret),
            },
        }
        for registry in sorted({registry_of(image) for image in images})
    ]

"""``fa-images export github``: a GitHub Actions workflow that runs ``fa-images build`` per job.

Each build job runs ``fa-images build --only ID...`` for its entries on a runner with Docker and
uploads its wheels, manifest, report and logs as an artifact; a final job downloads them all and
runs ``fa-images dist merge`` into one dist/. Jobs hold a tuple of entries, so grouping several
entries into one job (one compile for several Pythons) changes ``job_entries`` only.

With ``--shards N``, the split of ``export slurm --shards`` (sharding.py), the cache travelling
between jobs as artifacts: per compile group a matrix of N shard jobs, each compiling its part
of the kernels (``wheel --shard I/N``) in the group's devel base (builder_env.py) into a
compiler cache of its own, uploaded with its shard record; per entry a link job that downloads
every shard's artifact of its group into one cache (their entries are distinct files), links
with ``wheel --after-shards`` (which names a shard that did not finish) and uploads the wheel;
per entry a build job as above, but around that wheel (``build --wheels``: no compile); then
the merge. Artifacts rather than sccache's GitHub Actions cache backend: docs/build-farms.md says why.

Secrets are written as ``${{ secrets.NAME }}`` references, never as values. Those references,
``${{ !cancelled() }}`` and ``${{ matrix.shard }}`` (of a matrix of whole numbers written here)
are the only expressions in the file: every flag, path and matrix value that reaches it is
checked against its grammar first, so none can add one, end a comment or a line, or hand ``gh``
an option.
"""

from __future__ import annotations

import dataclasses
import json
import shlex

import yaml

from ...builder import untrusted
from ...builder.wording import counted
from ...config import groups
from ...config.matrix import Entry, Matrix
from ...errors import SourceError, UsageError
from .. import context, statements
from . import builder_env, runner_fit, sharding, slug
from .github_steps import (
    ARTIFACT_PREFIX,
    CHECKOUT,
    COSIGN,
    DOWNLOAD,
    UPLOAD,
    GithubOptions,
    install_steps,
    login_steps,
    secret,
)

# In a shard job, what its artifact holds; in a link job, where every shard's artifact lands.
SHARD_DIR = "fa-shard"
SHARD_CACHE = f"{SHARD_DIR}/cache"
SHARD_RECORDS = f"{SHARD_DIR}/records"
# In the container: shards and the link compile under one path, since the cache keys on it.
WORK_DIR = "/tmp/fa-images-work"
LINKED = "linked"  # the link job's --out: the wheel, manifest.json, simple/
WHEELS = "wheels"  # where a build job puts the linked wheels, one folder per entry
SHARD_INDEX = "${{ matrix.shard }}"
NOT_CANCELLED = "${{ !cancelled() }}"


# The build job's statements (`build --statements statements`), each image signed and each
# predicate attested with the job's identity; the types are the statements' own.
_TYPES = "\n".join(
    f"      {name}) type={kind} ;;" for kind, name in sorted(statements.STATEMENT_FILES.items(), key=lambda kv: kv[1])
)
KEYLESS_IMAGES = f"""set -euo pipefail
for dir in statements/*/image; do
  [ -f "$dir/{statements.SUBJECT_FILE}" ] || continue
  ref=$(cat "$dir/{statements.SUBJECT_FILE}")
  cosign sign --yes "$ref"
  for predicate in "$dir"/*.json; do
    case "$(basename "$predicate")" in
{_TYPES}
      *) continue ;;
    esac
    cosign attest --yes --type "$type" --predicate "$predicate" "$ref"
  done
done
"""
# The merged wheels, each with a Sigstore bundle beside it (WHEEL.sigstore.json): `cosign
# verify-blob --bundle` or `sigstore verify` checks it against the workflow's identity.
KEYLESS_WHEELS = """set -euo pipefail
for wheel in dist/*.whl; do
  cosign sign-blob --yes --bundle "$wheel.sigstore.json" "$wheel"
done
"""


def job_entries(entries: tuple[Entry, ...]) -> list[tuple[str, tuple[Entry, ...]]]:
    """(job id, its entries): one entry per job for now."""
    return [("build-" + slug(e.id), (e,)) for e in entries]


def _build_job(job_id: str, entries: tuple[Entry, ...], opts: GithubOptions, *, linked: bool = False) -> dict:
    """``fa-images build`` of ``entries``; ``linked``: around the wheels their link jobs made."""
    steps = install_steps(opts) + (login_steps([e.image for e in entries], opts) if opts.push else [])
    command = ["fa-images", "build", "--matrix", opts.matrix_file, "--only", *(e.id for e in entries)]
    if linked:
        steps += [_download_wheel(e) for e in entries]
        command += ["--wheels", *(_wheel_dir(e) for e in entries)]
    command += ["--dist", "dist", "--log-dir", "logs", "--report", "report.json"] + (["--push"] if opts.push else [])
    keyless = opts.sign == "keyless" and opts.push
    command += ["--statements", "statements"] if keyless else []
    steps.append(
        {
            "name": "Build the image around the linked wheel" if linked else "Build, check and export",
            "run": shlex.join(command),
        }
    )
    if keyless:
        steps += [
            {"name": "Install cosign", "uses": COSIGN},
            {"name": "Sign and attest the pushed images, keyless", "run": KEYLESS_IMAGES},
        ]
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
    job: dict = {"name": ", ".join(e.id for e in entries)}
    if linked:
        job["needs"] = [_link_job_id(e) for e in entries]
    job |= {"runs-on": list(opts.runs_on), "timeout-minutes": opts.timeout_minutes}
    if opts.push:
        job["permissions"] = {"contents": "read", "packages": "write"}
    if keyless:
        job["permissions"]["id-token"] = "write"  # the job's OIDC token: Fulcio's certificate of its identity
    job["steps"] = steps
    return job


# --- --shards: shard jobs and link jobs, the compiler cache travelling as artifacts ---------------


def _shard_job_id(group: str) -> str:
    return "shard-" + slug(group)


def _link_job_id(entry: Entry) -> str:
    return "link-" + slug(entry.id)


def _shard_artifact(group: str, index: str) -> str:
    """A '.' before the index: no group's slug holds one, so one group's pattern never takes another's."""
    return f"{ARTIFACT_PREFIX}shard-{slug(group)}.{index}"


def _wheel_artifact(entry: Entry) -> str:
    return f"{ARTIFACT_PREFIX}wheel-{slug(entry.id)}"


def _wheel_dir(entry: Entry) -> str:
    """A folder per entry: each linked wheel comes with a manifest.json of its own."""
    return f"{WHEELS}/{slug(entry.id)}"


def _download_wheel(entry: Entry) -> dict:
    return {
        "name": f"Download the wheel of {entry.id}",
        "uses": DOWNLOAD,
        "with": {"name": _wheel_artifact(entry), "path": _wheel_dir(entry)},
    }


def _builder_args(matrix: Matrix, entry: Entry) -> list[str]:
    """The builder's ``wheel`` arguments that a group's shards and every link share."""
    return sharding.wheel_args(
        entry,
        compiler_cache=SHARD_CACHE,
        work_dir=f"{WORK_DIR}/{slug(entry.compile_group)}",
        fetch=builder_env.sdist_fetch(
            matrix,
            "--shards",
            sources_dir=builder_env.sources_dir(matrix, "--shards"),
            instead="or export without --shards",
        ),
    )


def _in_container(matrix: Matrix, entry: Entry, opts: GithubOptions) -> dict:
    """A job's runner and container: the entry's devel base, set up as the builder stage is (builder_env.py)."""
    return {
        "runs-on": list(opts.runs_on),
        "timeout-minutes": opts.timeout_minutes,
        "container": builder_env.container(matrix, entry),
        "defaults": {"run": {"shell": "bash"}},
    }


def _setup_steps(matrix: Matrix, entry: Entry, opts: GithubOptions) -> list[dict]:
    return [
        {"uses": CHECKOUT},
        {
            "name": f"Python {entry.python}, torch {entry.torch} and the build tools, as in the builder stage",
            "run": builder_env.setup_script(matrix, entry, opts.install),
        },
    ]


def _shard_job(matrix: Matrix, group: str, entry: Entry, opts: GithubOptions) -> dict:
    """A matrix of N jobs: shard I compiles its kernels into a cache of its own and uploads it
    with its record (written last: a shard that failed uploads nothing)."""
    count = opts.shards
    # The shard's index reaches the script through the environment, not as an expression in it.
    arguments = shlex.join(_builder_args(matrix, entry)) + f' --shard "$FA_IMAGES_SHARD/{count}" --out {SHARD_RECORDS}'
    job = {
        "name": f"compile {group}: shards of {count}",
        **_in_container(matrix, entry, opts),
        "strategy": {"fail-fast": False, "matrix": {"shard": list(range(1, count + 1))}},
        "env": {"FA_IMAGES_SHARD": SHARD_INDEX},
    }
    job["steps"] = [
        *_setup_steps(matrix, entry, opts),
        {
            "name": f"Compile this shard of {count} into its compiler cache",
            "run": builder_env.builder_command(arguments),
        },
        {
            "name": "Upload this shard's compiler cache and record",
            "uses": UPLOAD,
            "with": {
                "name": _shard_artifact(group, SHARD_INDEX),
                "path": f"{SHARD_DIR}/",
                "if-no-files-found": "error",
                "retention-days": 1,  # read by this run's link jobs only
                "compression-level": 0,  # sccache's entries are zstd-compressed already
            },
        },
    ]
    return job


def _link_job(matrix: Matrix, entry: Entry, opts: GithubOptions) -> dict:
    """Every shard's cache of the entry's group in one, then ``wheel --after-shards``: the link
    refuses, naming it, when a shard did not finish; hence it runs whatever the shards' outcome."""
    group = entry.compile_group
    arguments = shlex.join([*_builder_args(matrix, entry), "--after-shards", SHARD_RECORDS, "--out", LINKED])
    job = {
        "name": f"link {entry.id}",
        "needs": [_shard_job_id(group)],
        "if": NOT_CANCELLED,
        **_in_container(matrix, entry, opts),
    }
    job["steps"] = [
        *_setup_steps(matrix, entry, opts),
        {
            "name": "Download every shard's compiler cache and record, into one",
            "uses": DOWNLOAD,
            "with": {"pattern": _shard_artifact(group, "*"), "path": SHARD_DIR, "merge-multiple": True},
        },
        {"name": "Link: every kernel from the cache, then verify", "run": builder_env.builder_command(arguments)},
        {
            "name": "Upload the wheel and its manifest",
            "uses": UPLOAD,
            "with": {"name": _wheel_artifact(entry), "path": f"{LINKED}/", "if-no-files-found": "error"},
        },
    ]
    return job


def _sharded_jobs(matrix: Matrix, entries: tuple[Entry, ...], opts: GithubOptions) -> dict[str, dict]:
    builder_env.refuse_what_a_job_cannot_reach(matrix, entries, "--shards")
    for entry in entries:
        sharding.check_entry(entry, "a workflow", shards=opts.shards)
    jobs = {_shard_job_id(g): _shard_job(matrix, g, e, opts) for g, e in groups.leaders(entries).items()}
    jobs |= {_link_job_id(e): _link_job(matrix, e, opts) for e in entries}
    jobs |= {job_id: _build_job(job_id, group, opts, linked=True) for job_id, group in job_entries(entries)}
    return jobs


def _merge_job(needs: list[str], opts: GithubOptions) -> dict:
    steps = install_steps(opts)
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
        "if": NOT_CANCELLED,
        "runs-on": list(opts.merge_runs_on),
        "timeout-minutes": 30,
    }
    if opts.sign == "keyless":  # after the merge, before dist/ is uploaded: the bundles travel with it
        steps[-1:-1] = [
            {"name": "Install cosign", "uses": COSIGN},
            {"name": "Sign the wheels, keyless", "run": KEYLESS_WHEELS},
        ]
        job["permissions"] = {"contents": "read", "id-token": "write"}
    if opts.release:
        job["permissions"] = job.get("permissions", {}) | {"contents": "write"}
        tag = shlex.quote(opts.release)
        steps.append(
            {
                "name": f"Upload the wheels to release {opts.release}",
                "env": {"GH_TOKEN": secret("GITHUB_TOKEN")},
                # No --clobber: a published wheel is never replaced under the same name.
                "run": f'gh release view {tag} >/dev/null 2>&1 || gh release create {tag} --title {tag} --notes ""\n'
                f"gh release upload {tag} dist/*.whl"
                + (" dist/*.sigstore.json" if opts.sign == "keyless" else "")
                + "\n",
            }
        )
    job["steps"] = steps
    return job


def workflow(matrix: Matrix, entries: tuple[Entry, ...], opts: GithubOptions) -> dict:
    opts.check()
    if opts.schedule is not None:
        from . import schedule

        return schedule.workflow(matrix, opts)
    builds = [job_id for job_id, _group in job_entries(entries)]
    if opts.shards > 1:
        jobs = _sharded_jobs(matrix, entries, opts)
    else:
        jobs = {job_id: _build_job(job_id, group, opts) for job_id, group in job_entries(entries)}
    jobs["merge"] = _merge_job(builds, opts)
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


def render(matrix: Matrix, entries: tuple[Entry, ...], opts: GithubOptions) -> str:
    opts.check()  # the header's comment names the matrix file: checked before it is written anywhere
    _check_archives(matrix, entries)
    runner_fit.check(
        entries,
        cpus=opts.runner_cpus,
        memory_gib=opts.runner_memory_gib,
        timeout=opts.timeout_minutes,
        shards=opts.shards,
        sharding=opts.schedule is None,  # a scheduled run's entries are known when it runs, not here
    )
    only = [e.id for e in entries] if len(entries) < len(matrix.entries) else None
    header = (
        f"# Generated by `fa-images export github` from {opts.matrix_file}. Do not edit: change the matrix or\n"
        "# the flags and export again. Secrets are referenced by name; their values live in the repository.\n"
        f"{OPTIONS_MARK}{recorded_line(opts, only)}\n"
    )
    body = yaml.dump(
        workflow(matrix, entries, opts), Dumper=_Dumper, sort_keys=False, width=1000, default_flow_style=False
    )
    return header + body


def _check_archives(matrix: Matrix, entries: tuple[Entry, ...]) -> None:
    """A job checks out the repository and builds there: source archives no index serves must be in
    its packages.sdists now. Every missing one in one error."""
    missing = []
    for entry in entries:
        if entry.recipe.source != "archive":
            continue
        try:
            context.source_archive(matrix, entry)
        except SourceError as exc:
            missing.append(exc)
    if missing:
        raise SourceError(
            f"{counted(len(missing), 'entry')} without a source archive: " + "; ".join(e.message for e in missing),
            hint=missing[0].hint,
        )


# The line of the header that records the flags the workflow was made with, so that `--check`
# compares it with what the same flags make now, with none of them given again.
OPTIONS_MARK = "# fa-images export github options: "
_RECORDED = {f.name for f in dataclasses.fields(GithubOptions)} - {"matrix_file"}


def recorded_line(opts: GithubOptions, only: list[str] | None) -> str:
    data = {k: v for k, v in dataclasses.asdict(opts).items() if k in _RECORDED}
    return json.dumps({**data, "only": only}, sort_keys=True, separators=(",", ":"))


def recorded_options(text: str | None, where: str) -> tuple[dict, list[str] | None]:
    """The flags a workflow records (``recorded_line``), as GithubOptions' fields, and its --only; a
    record that is not what fa-images writes is refused (the file is anyone's to edit)."""
    line = next((x for x in (text or "").splitlines()[:5] if x.startswith(OPTIONS_MARK)), None)
    if line is None:
        raise UsageError(
            f"{where} records no flags (an older export, or not fa-images'): give --check the flags it was made with"
        )
    try:
        data = untrusted.parse_json(line[len(OPTIONS_MARK) :].encode(), what=f"{where}'s recorded flags")
    except untrusted.UntrustedInput as exc:
        raise UsageError(str(exc)) from None
    kinds = {f.name: f.type for f in dataclasses.fields(GithubOptions)}
    if not isinstance(data, dict) or set(data) - _RECORDED - {"only"}:
        raise UsageError(f"{where}: its recorded flags are not what fa-images writes")
    only = data.pop("only", None)
    if only is not None and not (isinstance(only, list) and all(isinstance(i, str) for i in only)):
        raise UsageError(f"{where}: its recorded --only is not a list of entry ids")
    fields = {}
    for name, value in data.items():
        if "tuple" in str(kinds[name]):
            ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
            value = tuple(value) if ok else value
        elif "int" in str(kinds[name]):
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif "bool" in str(kinds[name]):
            ok = isinstance(value, bool)
        else:
            ok = value is None or isinstance(value, str)
        if not ok:
            raise UsageError(f"{where}: its recorded {name} {str(value)[:80]!r} is not what fa-images writes")
        fields[name] = value
    return fields, only

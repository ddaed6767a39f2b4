"""``fa-images export slurm``: batch scripts that build the matrix's wheels on a Slurm cluster.

The export dir must be on storage every node shares (NFS, as the seeds' clusters have); the
jobs run in it. ``submit.sh`` submits two jobs:

- ``build.sbatch``, an array job: one task per entry (it builds the wheel into
  ``wheels/<entry>/``), or with ``--shards N`` one task per shard of each compile group
  (``wheel --shard I/N`` into the group's compiler cache, ``cache/<group>/``, and
  ``shards/<group>/``);
- ``link.sbatch``, after the array whatever its outcome (``afterany``): with shards it links
  each entry (``wheel --after-shards``, which refuses with the shard's name when one did not
  finish); then it verifies and merges every entry's wheel into ``dist/`` with ``dist merge``,
  and fails, naming them, if any entry has none.

Each task asks for ``--cpus`` CPUs and the memory the builder's own sizing rule needs for them
(``environment.job_request``); inside the job the builder reads its cgroup and sizes itself.
No GPU is asked for. Values from the matrix and the flags are checked against their grammar
(config/grammar.py); ``--setup`` is free text, written shell-quoted and run with ``eval``, once
per entry after that entry's ``FA_IMAGES_*`` variables are set: in an array task, and in the link
job in a subshell of its own for each entry (so each Python is linked in its own environment).
The sdist comes from where every export's jobs fetch it (``builder_env.sdist_fetch``): the
matrix's ``packages.flash_attn_index``, after ``--sources-dir`` (or ``packages.sdists``).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from ...builder import environment, safe_io
from ...builder.wording import counted
from ...config import grammar, groups
from ...config.matrix import Entry, Matrix
from ...errors import UsageError
from . import builder_env, sharding, slug

GIB = 1 << 30
# A fixed node-local parent for the work dirs: a shard and the link must compile under one path.
DEFAULT_WORK_DIR = "/tmp/fa-images-slurm"
SCRIPTS = ("build.sbatch", "link.sbatch", "submit.sh")


@dataclass(frozen=True, kw_only=True)
class SlurmOptions:
    shards: int = 1  # 1: one task per entry, no split
    cpus: int = 16  # per task
    # shell run per entry, e.g. 'module load cuda/$FA_IMAGES_CUDA; source env/py$FA_IMAGES_PYTHON/bin/activate'
    setup: str = ""
    partition: str | None = None
    account: str | None = None
    time: str = "4:00:00"
    cache_dir: str | None = None  # absolute; default: cache/ in the export dir
    work_dir: str = DEFAULT_WORK_DIR  # node-local, the same path on every node
    sources_dir: str | None = None  # absolute: sdists for nodes without the index; default packages.sdists
    python: str = "python"  # the interpreter (after --setup) that runs fa-images

    def check(self) -> None:
        sharding.check_count(self.shards)
        if not 1 <= self.cpus <= 4096:
            raise UsageError(f"--cpus {self.cpus} must be between 1 and 4096")
        _refuse("--setup", [self.setup], grammar.shell_text)
        _refuse("--partition", [self.partition] if self.partition else [], grammar.slurm_name)
        _refuse("--account", [self.account] if self.account else [], grammar.slurm_name)
        _refuse("--time", [self.time], grammar.slurm_time)
        paths = [("--cache-dir", self.cache_dir), ("--work-dir", self.work_dir), ("--sources-dir", self.sources_dir)]
        for flag, path in paths:
            _refuse(flag, [path] if path else [], grammar.absolute_path)
        _refuse("--python", [self.python], _python)


def _python(value: str) -> str | None:
    if grammar.repo_path(value) is None:
        return None
    return f"{value!r} is not an interpreter name or path (letters, digits and _ . @ + = , ~ / -)"


def _refuse(flag: str, values: Iterable[str], check: Callable[[str], str | None]) -> None:
    for value in values:
        problem = check(value)
        if problem:
            raise UsageError(f"{flag} {problem}")


@dataclass(frozen=True)
class Task:
    """One array task: what it runs, and the file its log goes to."""

    label: str
    entry: Entry
    wheel_args: tuple[str, ...]


def sdist_fetch(matrix: Matrix, opts: SlurmOptions) -> builder_env.SdistFetch:
    """Where the jobs fetch the sdist: the matrix's index, after --sources-dir or packages.sdists
    (the nodes share storage, so the matrix's own folder serves them when its path is plain)."""
    sources = opts.sources_dir or matrix.packages.sdists
    problem = grammar.absolute_path(sources) if sources else None
    if problem:
        raise UsageError(f"packages.sdists {problem}: give the folder as the nodes name it with --sources-dir")
    return builder_env.sdist_fetch(
        matrix,
        "export slurm",
        sources_dir=sources,
        instead="or leave packages.flash_attn_index out and give the sdists with --sources-dir",
    )


def _wheel_args(entry: Entry, opts: SlurmOptions, fetch: builder_env.SdistFetch) -> list[str]:
    group = slug(entry.compile_group)
    return sharding.wheel_args(
        entry, compiler_cache=f"{opts.cache_dir or 'cache'}/{group}", work_dir=f"{opts.work_dir}/{group}", fetch=fetch
    )


def _group_lock(entry: Entry, opts: SlurmOptions) -> str:
    """The lock of the entry's compile group on a node: its tasks share one work dir there, and
    take turns; tasks of other groups run beside them."""
    return f"{opts.work_dir}/{slug(entry.compile_group)}.lock"


def tasks(entries: tuple[Entry, ...], opts: SlurmOptions, fetch: builder_env.SdistFetch) -> list[Task]:
    """The array's tasks, in index order: an entry each, or each compile group's shards."""
    if opts.shards == 1:
        return [Task(e.id, e, (*_wheel_args(e, opts, fetch), "--out", f"wheels/{e.id}")) for e in entries]
    out: list[Task] = []
    for group, entry in groups.leaders(entries).items():
        for index in range(1, opts.shards + 1):
            shard = ("--shard", f"{index}/{opts.shards}", "--out", f"shards/{slug(group)}")
            args = (*_wheel_args(entry, opts, fetch), *shard)
            out.append(Task(f"{slug(group)} shard {index}/{opts.shards}", entry, args))
    return out


def _header(job_name: str, opts: SlurmOptions, log: str) -> list[str]:
    _par, memory = environment.job_request(cpus=opts.cpus)
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --cpus-per-task={opts.cpus}",
        # The builder's sizing rule for these CPUs (jobs x nvcc threads x 5 GiB); no GPU needed.
        f"#SBATCH --mem={max(1, memory // GIB)}G",
        f"#SBATCH --time={opts.time}",
        f"#SBATCH --output={log}",
    ]
    lines += [f"#SBATCH --partition={opts.partition}"] if opts.partition else []
    lines += [f"#SBATCH --account={opts.account}"] if opts.account else []
    return lines


def _setup_text(opts: SlurmOptions) -> list[str]:
    """The user's --setup, shell-quoted here, so it cannot change this script."""
    return [
        "# shellcheck disable=SC2016  # the setup's $VARIABLES expand when it runs, per entry",
        f"FA_IMAGES_SETUP={shlex.quote(opts.setup)}",
    ]


def _run_setup(entry: Entry) -> str:
    """Runs --setup, after the entry's variables are set; a failure is named and ends the task."""
    said = shlex.quote(f"error: entry {entry.id}: --setup failed")
    return f'eval "$FA_IMAGES_SETUP" || {{ echo {said} >&2; exit 3; }}'


def _entry_exports(entry: Entry) -> str:
    """What a --setup may use to pick the entry's environment (e.g. a venv per Python)."""
    pairs = {
        "FA_IMAGES_ENTRY": entry.id,
        "FA_IMAGES_PYTHON": entry.python,
        "FA_IMAGES_TORCH": entry.torch,
        "FA_IMAGES_CUDA": entry.cuda,
    }
    return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in pairs.items())


def build_script(entries: tuple[Entry, ...], opts: SlurmOptions, fetch: builder_env.SdistFetch) -> str:
    task_list = tasks(entries, opts, fetch)
    lines = _header("fa-images-build", opts, "logs/build-%a.log")
    lines.append(f"#SBATCH --array=0-{len(task_list) - 1}")
    lines += [
        "# Generated by `fa-images export slurm`. Submit with ./submit.sh from this directory.",
        "set -uo pipefail",
        *_setup_text(opts),
        "# shellcheck disable=SC2054  # the commas are --archs lists, not array separators",
        'case "${SLURM_ARRAY_TASK_ID:?run this as an array task: ./submit.sh}" in',
    ]
    for index, task in enumerate(task_list):
        lines += [
            f"  {index})  # {task.label}",
            f"    {_entry_exports(task.entry)}",
            f"    FA_IMAGES_ARGS=({shlex.join(task.wheel_args)})",
            f"    FA_IMAGES_LOCK={shlex.quote(_group_lock(task.entry, opts))}",
            # The task's own entry: its variables are set above, for the setup to use.
            f"    {_run_setup(task.entry)}",
            "    ;;",
        ]
    lines += [
        '  *) echo "error: no task $SLURM_ARRAY_TASK_ID in this script" >&2; exit 2 ;;',
        "esac",
        'echo "fa-images task $SLURM_ARRAY_TASK_ID: $FA_IMAGES_ENTRY on $(hostname)"',
        # Tasks of one compile group on one node take turns: they compile under one fixed path.
        f"mkdir -p {shlex.quote(opts.work_dir)}",
        f'exec flock "$FA_IMAGES_LOCK" {shlex.quote(opts.python)} -m fa_images "${{FA_IMAGES_ARGS[@]}}"',
    ]
    return "\n".join(lines) + "\n"


def _in_entry_env(entry: Entry, command: str, *, then: str) -> list[str]:
    """``command`` in a subshell of its own with the entry's variables and --setup, then ``then``
    (``; then ...`` or `` || ...``): each entry links in its own environment, and nothing of one
    entry's setup reaches the next."""
    return ["(", f"  {_entry_exports(entry)}", f"  {_run_setup(entry)}", f"  {command}", f"){then}"]


def link_script(entries: tuple[Entry, ...], opts: SlurmOptions, fetch: builder_env.SdistFetch) -> str:
    lines = _header("fa-images-link", opts, "logs/link.log")
    lines += [
        "# Generated by `fa-images export slurm`. Runs after build.sbatch, whatever its outcome.",
        "# shellcheck disable=SC2030,SC2031  # each entry's variables live in its own subshell, on purpose",
        "set -uo pipefail",
        *_setup_text(opts),
        "built=()",
        "failed=()",
        f"mkdir -p {shlex.quote(opts.work_dir)}",
    ]
    python = shlex.quote(opts.python)
    for entry in entries:
        out = f"wheels/{entry.id}"
        if opts.shards > 1:
            group = slug(entry.compile_group)
            args = [*_wheel_args(entry, opts, fetch), "--after-shards", f"shards/{group}", "--out", out]
            link = f"flock {shlex.quote(_group_lock(entry, opts))} {python} -m fa_images {shlex.join(args)}"
            then = f"; then built+=({shlex.quote(out)}); else failed+=({shlex.quote(entry.id)}); fi"
            lines += ["if " + "\n".join(_in_entry_env(entry, link, then=then))]
        else:
            manifest = shlex.quote(f"{out}/manifest.json")
            lines.append(
                f"if [ -f {manifest} ]; then built+=({shlex.quote(out)}); "
                f"else echo {shlex.quote(f'error: entry {entry.id} built no wheel (see logs/build-*.log)')} >&2; "
                f"failed+=({shlex.quote(entry.id)}); fi"
            )
    # Any entry's fa-images merges; the first entry's environment is the one it runs in.
    merge = f'{python} -m fa_images dist merge "${{built[@]}}" --dist dist'
    lines += [
        "if [ ${#built[@]} -gt 0 ]; then",
        *_in_entry_env(entries[0], merge, then=" || exit $?"),
        "fi",
        "if [ ${#failed[@]} -gt 0 ]; then",
        '  echo "error: ${#failed[@]} entries have no wheel in dist/: ${failed[*]} (their logs are in logs/)" >&2',
        "  exit 1",
        "fi",
        'echo "dist: every entry verified and merged"',
    ]
    return "\n".join(lines) + "\n"


def submit_script() -> str:
    return (
        "\n".join(
            [
                "#!/bin/bash",
                "# Generated by `fa-images export slurm`: submits the array, then the link after it.",
                "set -euo pipefail",
                'cd "$(dirname "$0")"',
                "mkdir -p logs",
                'build=$(sbatch --parsable --chdir "$PWD" build.sbatch)',
                "build=${build%%;*}",
                'link=$(sbatch --parsable --chdir "$PWD" --dependency="afterany:$build" link.sbatch)',
                "link=${link%%;*}",
                'echo "submitted build array $build and link job $link; wheels land in $PWD/dist"',
            ]
        )
        + "\n"
    )


def export(matrix: Matrix, entries: tuple[Entry, ...], out_dir: Path, opts: SlurmOptions) -> list[Path]:
    """Writes the three scripts into ``out_dir`` (through safe_io); returns their paths."""
    opts.check()
    if not entries:
        raise UsageError("no entries to export")
    problems = []  # every entry's, in one error
    for entry in entries:
        try:
            sharding.check_entry(entry, "a batch script", shards=opts.shards)
        except UsageError as exc:
            problems.append(exc.message)
        if why := entry.recipe.farm_problem():
            problems.append(f"entry {entry.id!r}: {why}")
    if problems:
        raise UsageError(f"no batch script written, {counted(len(problems), 'problem')}: " + "; ".join(problems))
    fetch = sdist_fetch(matrix, opts)
    texts = {"build.sbatch": build_script(entries, opts, fetch), "link.sbatch": link_script(entries, opts, fetch)}
    texts["submit.sh"] = submit_script()
    out = safe_io.OutputDir(out_dir, what="--out-dir")
    return [out.write_text(name, text, mode=0o755) for name, text in texts.items()]

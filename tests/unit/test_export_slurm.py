"""``export slurm``: the scripts' shape, the sizing they ask for, and hostile flags refused."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from fa_images.builder import environment
from fa_images.config import matrix
from fa_images.outputs.exports import github, slurm


@pytest.fixture
def small_matrix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pinned_sdist: Callable[[Path], None]) -> Path:
    """Three entries, two of which share a compile group; the sdist is a local file pinned by a compat override."""
    pinned_sdist(tmp_path)
    (tmp_path / "matrix.yaml").write_text(
        "image: ghcr.io/acme/fa\ncompat: compat.yaml\n"
        'matrix:\n  python: ["3.11", "3.12"]\n  torch: ["2.9.1"]\n  flash_attn: ["2.8.3"]\n  archs: [[80]]\n'
        'entries:\n  - {python: "3.10", torch: "2.9.1", flash_attn: "2.8.3", archs: [80, 90]}\n'
    )
    monkeypatch.chdir(tmp_path)
    return tmp_path / "matrix.yaml"


def test_shards_split_each_compile_group_and_the_link_builds_each_entry(small_matrix: Path, tmp_path: Path) -> None:
    m = matrix.load(small_matrix)
    entries = m.entries
    opts = slurm.SlurmOptions(shards=3, cpus=16)
    tasks = slurm.tasks(entries, opts, slurm.sdist_fetch(m, opts))
    assert len(tasks) == 2 * 3  # two compile groups, three shards each; not one per Python
    assert [t.wheel_args[t.wheel_args.index("--shard") + 1] for t in tasks] == ["1/3", "2/3", "3/3"] * 2
    slurm.export(m, entries, tmp_path / "out", opts)
    link = (tmp_path / "out" / "link.sbatch").read_text()
    assert link.count("--after-shards") == 3  # every entry linked, each from its group's shards


def test_only_tasks_of_one_compile_group_take_turns_on_a_node(small_matrix: Path, tmp_path: Path) -> None:
    """Each task locks its group's work dir, not the node: two groups compile side by side."""
    m = matrix.load(small_matrix)
    opts = slurm.SlurmOptions(cpus=16)
    slurm.export(m, m.entries, tmp_path / "out", opts)
    build = (tmp_path / "out" / "build.sbatch").read_text()
    locks = [line.split("=", 1)[1] for line in build.splitlines() if line.strip().startswith("FA_IMAGES_LOCK=")]
    groups = [e.compile_group for e in m.entries]
    assert len(locks) == 3 and len(set(locks)) == len(set(groups)) == 2
    assert all(lock.startswith(f"{slurm.DEFAULT_WORK_DIR}/") and lock.endswith(".lock") for lock in locks)
    assert 'exec flock "$FA_IMAGES_LOCK" ' in build and f"flock {slurm.DEFAULT_WORK_DIR} " not in build


def test_tasks_ask_for_what_the_builder_s_sizing_uses(small_matrix: Path, tmp_path: Path) -> None:
    m = matrix.load(small_matrix)
    slurm.export(m, m.entries, tmp_path / "out", slurm.SlurmOptions(cpus=16))
    par, memory = environment.job_request(cpus=16)
    assert (par.max_jobs, par.nvcc_threads, memory) == (16, 1, 16 * environment.BYTES_PER_NVCC_THREAD)
    script = (tmp_path / "out" / "build.sbatch").read_text()
    assert "#SBATCH --cpus-per-task=16\n#SBATCH --mem=80G\n" in script
    assert "#SBATCH --array=0-2\n" in script  # one task per entry without --shards
    assert "gpu" not in script.lower() and "gres" not in script


def test_setup_is_shell_quoted_and_cannot_change_the_script(small_matrix: Path, tmp_path: Path) -> None:
    setup = "module load cuda/12.8; source env/bin/activate; echo \"$(id)\" 'it''s' `x` && exit 0 #"
    m = matrix.load(small_matrix)
    slurm.export(m, m.entries, tmp_path / "out", slurm.SlurmOptions(setup=setup, shards=2))
    for name in ("build.sbatch", "link.sbatch"):
        script = (tmp_path / "out" / name).read_text()
        # bash reads the assignment back as exactly the text given
        (assignment,) = [line for line in script.splitlines() if line.startswith("FA_IMAGES_SETUP=")]
        probe = assignment + '\nprintf %s "$FA_IMAGES_SETUP"'
        assert subprocess.run(["bash", "-c", probe], capture_output=True, text=True).stdout == setup
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")  # the test extras'
    for name in ("build.sbatch", "link.sbatch", "submit.sh"):
        proc = subprocess.run([shellcheck, "-S", "warning", str(tmp_path / "out" / name)], capture_output=True)
        assert proc.returncode == 0, proc.stdout.decode()


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--setup", "module load cuda\nrm -rf ~"], "holds a control character"),
        (["--setup", "x" * 5000], "at most 4096"),
        (["--partition", "gpu;rm"], "is not a Slurm name"),
        (["--partition=-p"], "is not a Slurm name"),
        (["--account", "a b"], "is not a Slurm name"),
        (["--time", "forever"], "is not a Slurm time limit"),
        (["--time", "1:00:00;x"], "is not a Slurm time limit"),
        (["--cache-dir", "relative/cache"], "is not a plain absolute path"),
        (["--cache-dir", "/nfs/$(whoami)"], "is not a plain absolute path"),
        (["--work-dir", "/tmp/../etc"], "no '..'"),
        (["--sources-dir", "/a b"], "is not a plain absolute path"),
        (["--python", "python; rm"], "is not an interpreter"),
        (["--shards", "0"], "is not a positive integer"),
        (["--shards", "1001"], "between 1 and 1000"),
        (["--cpus", "-4"], "is not a positive integer"),
    ],
)
def test_hostile_flags_are_one_clear_error(
    small_matrix: Path, tmp_path: Path, flags: list[str], says: str, run_fa_images
) -> None:
    out = tmp_path / "out"
    proc = run_fa_images(["export", "slurm", "--matrix", small_matrix, "--out-dir", out, *flags], cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not out.exists(), "nothing is written for refused input"


def test_the_out_dir_is_never_followed_through_a_symlink(small_matrix: Path, tmp_path: Path, run_fa_images) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "build.sbatch").symlink_to(tmp_path / "elsewhere" / "planted")
    proc = run_fa_images(["export", "slurm", "--matrix", small_matrix, "--out-dir", tmp_path / "out"], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert not (tmp_path / "elsewhere" / "planted").exists()


# --- --setup per entry, after its variables; the matrix's flash-attn index ------------------------


def _fake_tools(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in for the Python the scripts run: it records the entry it runs for, the
    environment its --setup made, and its arguments, one line each, in ``trace``."""
    trace = tmp_path / "trace"
    fake = tmp_path / "bin" / "fake-python"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "run $FA_IMAGES_ENTRY env=$FAKE_ENV $*" >> "$TRACE"\n')
    fake.chmod(0o755)
    return trace, fake


# As the README's example uses it: a venv per Python, named by $FA_IMAGES_PYTHON, under `set -u`.
PER_PYTHON_SETUP = 'export FAKE_ENV=py$FA_IMAGES_PYTHON; echo "setup $FA_IMAGES_ENTRY py$FA_IMAGES_PYTHON" >> "$TRACE"'


def _run(script: Path, trace: Path, **env: str) -> list[str]:
    trace.unlink(missing_ok=True)
    environ = {"PATH": "/usr/bin:/bin", "TRACE": str(trace), **env}
    proc = subprocess.run(["bash", script.name], cwd=script.parent, env=environ, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return trace.read_text().splitlines()


@pytest.mark.parametrize("shards", [1, 2])
def test_setup_runs_once_per_entry_after_its_variables(small_matrix: Path, tmp_path: Path, shards: int) -> None:
    """Each array task runs --setup once, with its entry's variables set (the README's example
    uses $FA_IMAGES_PYTHON under `set -u`); the link job runs it once per entry, each entry in
    an environment of its own, and the merge in the first entry's."""
    m = matrix.load(small_matrix)
    trace, fake = _fake_tools(tmp_path)
    opts = slurm.SlurmOptions(setup=PER_PYTHON_SETUP, shards=shards, python=str(fake), work_dir=str(tmp_path / "w"))
    out = tmp_path / "out"
    slurm.export(m, m.entries, out, opts)
    for index, task in enumerate(slurm.tasks(m.entries, opts, slurm.sdist_fetch(m, opts))):
        e = task.entry
        lines = _run(out / "build.sbatch", trace, SLURM_ARRAY_TASK_ID=str(index))
        assert lines == [
            f"setup {e.id} py{e.python}",
            f"run {e.id} env=py{e.python} -m fa_images {shlex.join(task.wheel_args)}",
        ]
    if shards == 1:
        for entry in m.entries:  # the tasks' wheels, as the link job finds them
            (out / "wheels" / entry.id).mkdir(parents=True)
            (out / "wheels" / entry.id / "manifest.json").write_text("{}")
    lines = _run(out / "link.sbatch", trace)
    linked = [(e.id, e.python) for e in m.entries] if shards > 1 else []
    expected = [line for i, p in linked for line in (f"setup {i} py{p}", f"run {i} env=py{p} -m fa_images wheel")]
    first, built = m.entries[0], " ".join(f"wheels/{e.id}" for e in m.entries)
    expected += [
        f"setup {first.id} py{first.python}",
        f"run {first.id} env=py{first.python} -m fa_images dist merge {built}",
    ]
    assert [line.split(" --", 1)[0] for line in lines] == expected
    assert sum("--after-shards" in line for line in lines) == len(linked)


def test_a_failing_setup_names_its_entry_and_fails_only_that_entry(small_matrix: Path, tmp_path: Path) -> None:
    m = matrix.load(small_matrix)
    trace, fake = _fake_tools(tmp_path)
    setup = 'test "$FA_IMAGES_PYTHON" != 3.12 && export FAKE_ENV=ok'
    opts = slurm.SlurmOptions(setup=setup, shards=2, python=str(fake), work_dir=str(tmp_path / "w"))
    slurm.export(m, m.entries, tmp_path / "out", opts)
    environ = {"PATH": "/usr/bin:/bin", "TRACE": str(trace)}
    proc = subprocess.run(["bash", "link.sbatch"], cwd=tmp_path / "out", env=environ, capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    bad = next(e for e in m.entries if e.python == "3.12")
    assert f"error: entry {bad.id}: --setup failed" in proc.stderr
    assert f"error: 1 entries have no wheel in dist/: {bad.id} " in proc.stderr
    assert [line.split()[1] for line in trace.read_text().splitlines()] == [e.id for e in m.entries if e is not bad] + [
        m.entries[0].id
    ]


def _with_packages(small_matrix: Path, packages: str) -> Path:
    text = small_matrix.read_text().replace("compat: compat.yaml\n", f"compat: compat.yaml\npackages: {packages}\n")
    small_matrix.write_text(text)
    return small_matrix


def test_the_jobs_fetch_from_the_matrix_s_flash_attn_index_as_the_workflow_does(
    small_matrix: Path, tmp_path: Path
) -> None:
    index = "https://mirror.example.org/fa/simple"
    m = matrix.load(_with_packages(small_matrix, f"{{flash_attn_index: {index!r}}}"))
    for shards in (1, 2):
        out = tmp_path / f"out{shards}"
        slurm.export(m, m.entries, out, slurm.SlurmOptions(shards=shards))
        text = (out / "build.sbatch").read_text() + (out / "link.sbatch").read_text()
        wheel_lines = [line for line in text.splitlines() if "wheel --flash-attn" in line]
        assert len(wheel_lines) == len(
            slurm.tasks(m.entries, slurm.SlurmOptions(shards=shards), slurm.sdist_fetch(m, slurm.SlurmOptions()))
        ) + (len(m.entries) if shards > 1 else 0)
        assert all(f" --index-url {index} " in line for line in wheel_lines)
        assert "pypi.org" not in text
    # One answer for both farms: the workflow's shard and link jobs name the same index.
    workflow = github.render(m, m.entries, github.GithubOptions(matrix_file="matrix.yaml", shards=2))
    assert workflow.count(f"--index-url {index} ") == 2 + len(m.entries)


def test_the_matrix_s_sdists_folder_is_searched_first(small_matrix: Path, tmp_path: Path) -> None:
    m = matrix.load(_with_packages(small_matrix, "{sdists: sdists}"))
    slurm.export(m, m.entries, tmp_path / "out", slurm.SlurmOptions())
    assert f"--sources-dir {tmp_path / 'sdists'} " in (tmp_path / "out" / "build.sbatch").read_text()
    opts = slurm.SlurmOptions(sources_dir="/nfs/sdists")  # the flag names the folder as the nodes see it
    assert slurm.sdist_fetch(m, opts).sources_dir == "/nfs/sdists"


@pytest.mark.parametrize(
    ("packages", "says"),
    [
        ("{flash_attn_index: 'https://me:s3cret@fa.example.org/simple'}", "carries credentials"),
        ("{flash_attn_index: 'file:///srv/fa'}", "is on this host"),
    ],
)
def test_an_index_the_jobs_cannot_use_is_refused(
    small_matrix: Path, tmp_path: Path, packages: str, says: str, run_fa_images
) -> None:
    _with_packages(small_matrix, packages)
    out = tmp_path / "out"
    proc = run_fa_images(["export", "slurm", "--matrix", small_matrix, "--out-dir", out], cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("error: ") and "packages.flash_attn_index" in line and says in line, line
    assert "s3cret" not in proc.stderr + proc.stdout
    assert not out.exists(), "nothing is written for refused input"

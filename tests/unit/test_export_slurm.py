"""``export slurm``: the scripts' shape, the sizing they ask for, and hostile flags refused."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from fa_images.builder import environment
from fa_images.config import matrix
from fa_images.outputs.exports import slurm


@pytest.fixture
def small_matrix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Three entries, two of which share a compile group."""
    sha = hashlib.sha256(b"sdist").hexdigest()
    (tmp_path / "compat.yaml").write_text(f'flash_attn:\n  "2.8.3": {{sha256: {sha}, cuda_archs_env: true}}\n')
    (tmp_path / "matrix.yaml").write_text(
        "image: ghcr.io/acme/fa\ncompat: compat.yaml\n"
        'matrix:\n  python: ["3.11", "3.12"]\n  torch: ["2.9.1"]\n  flash_attn: ["2.8.3"]\n  archs: [[80]]\n'
        'entries:\n  - {python: "3.10", torch: "2.9.1", flash_attn: "2.8.3", archs: [80, 90]}\n'
    )
    monkeypatch.chdir(tmp_path)
    return tmp_path / "matrix.yaml"


def test_shards_split_each_compile_group_and_the_link_builds_each_entry(small_matrix: Path, tmp_path: Path) -> None:
    entries = matrix.load(small_matrix).entries
    opts = slurm.SlurmOptions(shards=3, cpus=16)
    tasks = slurm.tasks(entries, opts)
    assert len(tasks) == 2 * 3  # two compile groups, three shards each; not one per Python
    assert [t.wheel_args[t.wheel_args.index("--shard") + 1] for t in tasks] == ["1/3", "2/3", "3/3"] * 2
    slurm.export(entries, tmp_path / "out", opts)
    link = (tmp_path / "out" / "link.sbatch").read_text()
    assert link.count("--after-shards") == 3  # every entry linked, each from its group's shards


def test_tasks_ask_for_what_the_builder_s_sizing_uses(small_matrix: Path, tmp_path: Path) -> None:
    entries = matrix.load(small_matrix).entries
    slurm.export(entries, tmp_path / "out", slurm.SlurmOptions(cpus=16))
    par, memory = environment.job_request(cpus=16)
    assert (par.max_jobs, par.nvcc_threads, memory) == (16, 1, 16 * environment.BYTES_PER_NVCC_THREAD)
    script = (tmp_path / "out" / "build.sbatch").read_text()
    assert "#SBATCH --cpus-per-task=16\n#SBATCH --mem=80G\n" in script
    assert "#SBATCH --array=0-2\n" in script  # one task per entry without --shards
    assert "gpu" not in script.lower() and "gres" not in script


def test_setup_is_shell_quoted_and_cannot_change_the_script(small_matrix: Path, tmp_path: Path) -> None:
    setup = "module load cuda/12.8; source env/bin/activate; echo \"$(id)\" 'it''s' `x` && exit 0 #"
    entries = matrix.load(small_matrix).entries
    slurm.export(entries, tmp_path / "out", slurm.SlurmOptions(setup=setup, shards=2))
    for name in ("build.sbatch", "link.sbatch"):
        script = (tmp_path / "out" / name).read_text()
        # bash reads the assignment back as exactly the text given
        probe = script.split("\neval ", 1)[0].split("\n")[-1] + '\nprintf %s "$FA_IMAGES_SETUP"'
        assert subprocess.run(["bash", "-c", probe], capture_output=True, text=True).stdout == setup
    if shutil.which("shellcheck"):
        for name in ("build.sbatch", "link.sbatch", "submit.sh"):
            proc = subprocess.run(["shellcheck", "-S", "warning", str(tmp_path / "out" / name)], capture_output=True)
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

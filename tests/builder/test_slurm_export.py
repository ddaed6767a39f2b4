"""``export slurm --shards 3`` on a real Slurm (Debian's slurmctld, slurmd and munge on 127.0.0.1):
the exported scripts build the tiny flash-attn-shaped sdist (three kernels) in three shards and a
link job, with the real nvcc and torch of the toolchain; a killed shard fails the link job.

``--setup`` is the README's: it activates a venv per Python by ``$FA_IMAGES_PYTHON`` (here the
toolchain venv, under the name of the entry's Python), which the scripts run under ``set -u``."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path

import pytest
import slurm_env
from fixtures.tiny import make_tiny_sdist

from fa_images.config import matrix

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARDS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    missing = slurm_env.missing_tools()
    if missing:
        pytest.fail(f"Slurm is not installed ({', '.join(missing)}): run .ci/setup")
    cpus = len(os.sched_getaffinity(0))
    with slurm_env.cluster(tmp_path_factory.mktemp("slurm"), cpus=cpus, memory_mb=5 * 1024 * cpus + 1024) as handle:
        yield handle


@pytest.fixture(scope="module")
def project(tmp_path_factory, venv_torch: dict) -> Path:
    """A matrix of one entry for the toolchain venv's torch; its sdist is the tiny one as 2.8.3."""
    root = tmp_path_factory.mktemp("slurm-project")
    sdist = make_tiny_sdist(root / "sdists", version="2.8.3", kernels=3)
    sha = hashlib.sha256(sdist.read_bytes()).hexdigest()
    (root / "compat.yaml").write_text(f'flash_attn:\n  "2.8.3": {{sha256: {sha}, cuda_archs_env: true}}\n')
    python = f"{venv_torch['cp'][2]}.{venv_torch['cp'][3:]}"
    (root / "matrix.yaml").write_text(
        "image: reg.local/fa\ncompat: compat.yaml\n"
        f'matrix:\n  python: ["{python}"]\n  torch: ["2.9.1"]\n  flash_attn: ["2.8.3"]\n  archs: [[80]]\n'
    )
    return root


def export(project: Path, name: str, run_fa_images, toolchain_venv: Path, cuda_home: Path) -> Path:
    out = project / name
    envs = project / "envs"
    if not envs.exists():  # a venv per Python, as a cluster's shared storage holds them
        envs.mkdir()
        for python in {e.python for e in matrix.load(project / "matrix.yaml").entries}:
            (envs / f"py{python}").symlink_to(toolchain_venv)
    setup = (
        f"source {envs}/py$FA_IMAGES_PYTHON/bin/activate; export PYTHONPATH={REPO_ROOT} CUDA_HOME={cuda_home}; "
        'echo "setup: $FA_IMAGES_ENTRY py$FA_IMAGES_PYTHON"'
    )
    proc = run_fa_images(
        ["export", "slurm", "--matrix", project / "matrix.yaml", "--out-dir", out, "--shards", str(SHARDS)]
        + ["--cpus", str(len(os.sched_getaffinity(0))), "--setup", setup, "--sources-dir", project / "sdists"]
        + ["--cache-dir", project / "cache", "--work-dir", project / "work", "--time", "30"],
        cwd=project,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def submit(cluster: slurm_env.Cluster, out: Path) -> tuple[str, str]:
    said = cluster.run(str(out / "submit.sh")).stdout
    match = re.search(r"submitted build array (\d+) and link job (\d+)", said)
    assert match, said
    return match.group(1), match.group(2)


def _log(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else f"({path.name} missing)"


@pytest.fixture(scope="module")
def built(cluster, project: Path, run_fa_images, toolchain_venv: Path, cuda_home: Path) -> dict:
    out = export(project, "run", run_fa_images, toolchain_venv, cuda_home)
    started = time.monotonic()
    array, link = submit(cluster, out)
    state = cluster.wait(link, timeout=1200)
    return {"out": out, "array": cluster.jobs(array), "link": state, "seconds": time.monotonic() - started}


def test_the_exported_scripts_ask_for_the_builder_s_sizing_and_no_gpu(built: dict) -> None:
    script = (built["out"] / "build.sbatch").read_text()
    cpus = len(os.sched_getaffinity(0))
    assert f"#SBATCH --cpus-per-task={cpus}\n" in script
    assert f"#SBATCH --mem={5 * cpus}G\n" in script  # cpus jobs x 1 nvcc thread (one arch) x 5 GiB
    assert f"#SBATCH --array=0-{SHARDS - 1}\n" in script
    assert "gres" not in script and "gpu" not in script.lower()


def test_three_shards_and_the_link_land_a_verified_wheel_in_dist(built: dict) -> None:
    out = built["out"]
    logs = "\n".join(_log(p) for p in sorted((out / "logs").glob("*.log")))
    assert [j["JobState"] for j in built["array"]] == ["COMPLETED"] * SHARDS, logs[-6000:]
    assert built["link"]["JobState"] == "COMPLETED", logs[-6000:]
    link_log = _log(out / "logs" / "link.log")
    assert "compiler cache: 3 of 3 kernel compiles taken from the cache" in link_log, link_log[-4000:]
    (wheel,) = (out / "dist").glob("*.whl")
    assert f"{wheel.name}: sound" in link_log
    assert list(json.loads((out / "dist" / "manifest.json").read_text())["wheels"]) == [wheel.name]
    assert "dist: every entry verified and merged" in link_log
    # --setup ran per entry, after its variables, under `set -u`: once before the link, once before the merge.
    (entry,) = matrix.load(built["out"].parent / "matrix.yaml").entries
    said = f"setup: {entry.id} py{entry.python}"
    assert link_log.count(said) == 2 and "unbound variable" not in logs, link_log[-4000:]
    assert all(said in _log(p) for p in (out / "logs").glob("build-*.log")), logs[-4000:]
    kernels = sorted(k for p in (out / "shards").glob("*/shard-*.json") for k in json.loads(p.read_text())["kernels"])
    assert kernels == ["tiny_attn_fwd.cu", "tiny_extra_1.cu", "tiny_extra_2.cu"]  # each kernel in one shard
    print(f"3 shards and the link on Slurm: {built['seconds']:.0f} s")


def test_a_killed_shard_fails_the_link_job_and_leaves_no_wheel(
    built: dict, cluster, project: Path, run_fa_images, toolchain_venv: Path, cuda_home: Path
) -> None:
    out = export(project, "killed", run_fa_images, toolchain_venv, cuda_home)
    array, link = submit(cluster, out)
    deadline = time.monotonic() + 300
    while cluster.jobs(f"{array}_0")[0].get("JobState") != "RUNNING":
        assert time.monotonic() < deadline, cluster.logs()
        time.sleep(0.5)
    time.sleep(2)  # let it start compiling
    cluster.run("scancel", f"{array}_0")
    state = cluster.wait(link, timeout=600)
    link_log = _log(out / "logs" / "link.log")
    assert cluster.jobs(f"{array}_0")[0]["JobState"] == "CANCELLED"
    assert state["JobState"] == "FAILED", link_log
    assert f"error: shard 1/{SHARDS} did not finish (no shard-1-of-{SHARDS}.json in " in link_log, link_log
    assert "error: 1 entries have no wheel in dist/" in link_log
    assert not list(out.glob("**/*.whl")), "no wheel, whole or partial, may be left"

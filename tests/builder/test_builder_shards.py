"""``wheel --shard I/N`` and ``--after-shards``, with a real nvcc and torch: a tiny sdist of three
kernels compiled in two shards into one compiler cache, then linked with every kernel from it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fixtures.tiny import make_tiny_sdist

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def split(tmp_path_factory, run_fa_images, venv_python: str, toolchain_venv: Path, cuda_home: Path) -> dict:
    root = tmp_path_factory.mktemp("shards")
    sdist = make_tiny_sdist(root / "sdist", kernels=3)
    env = {"CUDA_HOME": str(cuda_home), "PATH": f"{toolchain_venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    common = ["wheel", "--sdist", sdist, "--archs", "80", "--work-dir", root / "work"]
    common += ["--compiler-cache", root / "cache"]

    def run(*args: str | Path):
        return run_fa_images([*common, *args], python=venv_python, env=env, cwd=root, timeout=1200)

    runs = {"1/2": run("--shard", "1/2", "--out", root / "shards")}
    runs["early link"] = run("--after-shards", root / "shards", "--out", root / "early")  # shard 2 not done
    runs["2/2"] = run("--shard", "2/2", "--out", root / "shards")
    runs["link"] = run("--after-shards", root / "shards", "--out", root / "dist")
    return {"root": root, "runs": runs}


def _ok(proc) -> None:
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


def test_each_shard_compiles_its_balanced_part_and_makes_no_wheel(split: dict) -> None:
    root, runs = split["root"], split["runs"]
    _ok(runs["1/2"])
    _ok(runs["2/2"])
    records = {p.name: json.loads(p.read_text()) for p in (root / "shards").iterdir()}
    assert sorted(records) == ["shard-1-of-2.json", "shard-2-of-2.json"]
    # Equal costs (the tiny kernels are not in compile_costs.json): longest first, each to the lightest.
    assert records["shard-1-of-2.json"]["kernels"] == ["tiny_attn_fwd.cu", "tiny_extra_2.cu"]
    assert records["shard-2-of-2.json"]["kernels"] == ["tiny_extra_1.cu"]
    assert "compiler cache: 0 of 2 kernel compiles taken from the cache" in runs["1/2"].stdout
    assert not list((root / "shards").glob("*.whl")), "a shard makes no wheel"


def test_a_link_before_every_shard_finished_is_refused(split: dict) -> None:
    proc = split["runs"]["early link"]
    assert proc.returncode == 5, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stderr.startswith("error: shard 2/2 did not finish (no shard-2-of-2.json in "), proc.stderr
    assert not (split["root"] / "early").exists() or not list((split["root"] / "early").iterdir())


def test_the_link_takes_every_kernel_from_the_cache_and_verifies_the_wheel(split: dict) -> None:
    root, proc = split["root"], split["runs"]["link"]
    _ok(proc)
    assert "compiler cache: 3 of 3 kernel compiles taken from the cache" in proc.stdout, proc.stdout[-3000:]
    (wheel,) = (root / "dist").glob("*.whl")
    assert f"{wheel.name}: sound" in proc.stdout
    assert list(json.loads((root / "dist" / "manifest.json").read_text())["wheels"]) == [wheel.name]

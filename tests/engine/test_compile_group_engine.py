"""A compile group of two Pythons on a real Docker Engine: the second takes its kernels from
the compiler cache the first left.

Real parts throughout: a dockerd, the CUDA devel stand-in with a second CPython (3.12) beside
Debian's 3.11, torch 2.9.1 (CUDA 12.8) for both from the tests' local index, the rendered Dockerfiles,
the builder and the pinned sccache in the builder stage. flash-attn is the tiny extension of
the same shape: one CUDA kernel (no Python.h) and one C++ file that binds it to Python.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import engine_env
import pytest
import yaml
from fixtures.tiny import make_tiny_sdist

from fa_images.builder.source import sha256_of

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]
# A version of its own: the first Python's compile must run (a layer-cache hit reports no
# compiler-cache counters), so that the second's hits are from that compile.
VERSION = "2.8.3.dev5"
PYTHONS = ("3.11", "3.12")
SECOND = PYTHONS[1]


def entry_id(python: str) -> str:
    return f"fa{VERSION}-py{python}-torch2.9.1-cu128"


@pytest.fixture(scope="module")
def group_build(tmp_path_factory, stock: engine_env.Stock):
    """`fa-images build` of one group, the two Pythons in one run, with a fresh compiler cache."""
    if stock.second_python != SECOND:
        pytest.skip(f"no CPython {SECOND} with its own prefix (e.g. a pyenv build) to put in the stand-in images")
    root = tmp_path_factory.mktemp("compile-group")
    (root / "sdists").mkdir()
    sha = sha256_of(make_tiny_sdist(root / "sdists", version=VERSION))
    (root / "compat.yaml").write_text(
        yaml.safe_dump({"flash_attn": {VERSION: {"sha256": sha, "cuda_archs_env": True}}})
    )
    engine = stock.engine
    # The shared engine, bases and index (tests/engine/conftest.py).
    matrix = {
        "image": "fa-images-test/flash-attn-group",
        "bases": stock.bases(),
        "packages": stock.packages(),
        "build": {"network": "host"},
        "compat": "compat.yaml",
        "entries": [
            {"python": py, "torch": "2.9.1", "cuda": "12.8", "flash_attn": VERSION, "archs": ["80"]} for py in PYTHONS
        ],
    }
    (root / "matrix.yaml").write_text(yaml.safe_dump(matrix, sort_keys=False))
    env = engine.env(PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", XDG_CACHE_HOME=str(root / "cache-home"))
    plan = subprocess.run(
        [sys.executable, "-m", "fa_images", "plan", "--json"], cwd=root, env=env, capture_output=True, text=True
    )
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "fa_images", "build", "--gpus", "none", "--report", "report.json"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=3000,
    )
    print(f"group build: {time.monotonic() - started:.0f} s\n{proc.stderr[-5000:]}")
    report = json.loads((root / "report.json").read_text())
    yield root, json.loads(plan.stdout), proc, {e["id"]: e for e in report["entries"]}
    # Its second Python's torch stage is no other module's: freed now, not at the end of the run.
    engine_env.remove_images(engine.client, "fa-images-test/flash-attn-group")


def test_the_two_pythons_are_one_group(group_build) -> None:
    _root, plan, _proc, _results = group_build
    assert [e["python"] for e in plan] == list(PYTHONS)
    assert len({e["group"] for e in plan}) == 1


def test_both_entries_build_and_pass_their_checks(group_build) -> None:
    _root, _plan, proc, results = group_build
    assert proc.returncode == 0, proc.stderr[-3000:]
    for python in PYTHONS:
        result = results[entry_id(python)]
        assert (result["status"], result["check"]) == ("ok", "passed"), result
        tag = f"cp{python.replace('.', '')}"
        assert re.search(rf"-{tag}-{tag}-manylinux_2_\d+_x86_64\.whl$", Path(result["wheel"]).name), result["wheel"]


def test_the_first_python_compiles_the_kernel_and_the_second_takes_it_from_the_cache(group_build) -> None:
    """sccache's own counters, as the builder reports them: the kernel (.cu) compiled once."""
    root, _plan, proc, results = group_build
    first, second = (results[entry_id(py)] for py in PYTHONS)
    assert (first["kernels"], first["kernels_from_cache"]) == (1, 0)
    assert (second["kernels"], second["kernels_from_cache"]) == (1, 1)
    assert (
        f"{entry_id(SECOND)} · [fa-images] compiler cache: 1 of 1 kernel compiles taken from the cache" in proc.stderr
    )
    log = (root / "logs" / f"{entry_id(SECOND)}.log").read_text()
    assert "[fa-images] compiler cache: 1 of 1 kernel compiles taken from the cache" in log


def test_the_host_keeps_the_groups_cache_for_the_next_run(group_build) -> None:
    root, plan, _proc, _results = group_build
    caches = root / "cache-home" / "fa-images" / "compiler-cache"
    assert sorted(p.name for p in caches.iterdir()) == [plan[0]["group"]]  # no staging dir left
    objects = [p for p in (caches / plan[0]["group"]).rglob("*") if p.is_file()]
    assert objects and sum(p.stat().st_size for p in objects) > 10_000

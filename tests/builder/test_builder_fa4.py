"""FlashAttention-4's kernel cache as far as a CPU allows: ``fa4-cache`` compiles a small grid for
an H100 on this GPU-less machine (torch's fake tensors), next to the toolchain venv's real torch
(2.9.1, a CUDA build) and FA4's pinned set; then the check there finds the kernels and, with no
GPU, says so. The grid's run on a GPU, with 0 compiles at its first calls, is
bench/gpu_container/fa4_native.sh's and fa4_check.sh's."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import toolchain

from fa_images.builder import contract
from fa_images.builder.generations import fa4

REPO = Path(__file__).resolve().parents[2]
# One call of a grid: a forward keeping the LSE and its backward (4 kernels), head dim 128, causal.
GRID = ["--head-dims", "128", "--kv-heads", "16", "--causal", "true", "--modes", "train", "--seqlen", "1024"]


def run_with_fa4(python: str, site: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``python -m fa_images.builder ARGS`` with FA4's site dir added as a site (its .pth files read)."""
    boot = (
        "import runpy, site, sys; site.addsitedir(sys.argv.pop(1)); "
        "runpy.run_module('fa_images.builder', run_name='__main__')"
    )
    full = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": "", **env}
    return subprocess.run([python, "-c", boot, str(site), *args], capture_output=True, text=True, env=full, timeout=900)


@pytest.fixture(scope="module")
def fa4_cache(venv_python: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    version = subprocess.run([venv_python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    site = toolchain.fa4_site(version)
    cache = tmp_path_factory.mktemp("fa4") / "cache"
    proc = run_with_fa4(venv_python, site, ["fa4-cache", "--out", str(cache), "--target", "H100:9.0:132", *GRID], {})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return site, cache


def test_fa4s_kernels_compile_for_an_h100_on_a_machine_without_a_gpu(fa4_cache) -> None:
    _site, cache = fa4_cache
    assert fa4.kernels_in(cache) == 4  # forward, and the backward's preprocess, main and postprocess
    grid = fa4.Fa4Grid.from_json((cache / fa4.GRID_FILE).read_text())
    assert grid.head_dims == (128,) and grid.modes == ("train",)
    assert json.loads((cache / fa4.GRID_FILE).read_text())["seqlen"] == 1024


def test_the_check_finds_the_kernels_and_with_no_gpu_says_so(fa4_cache, venv_python: str) -> None:
    site, cache = fa4_cache
    env = {fa4.CACHE_ON_ENV: "1", fa4.CACHE_ENV: str(cache)}
    proc = run_with_fa4(venv_python, site, ["check"], env)
    assert proc.returncode == contract.EXIT_NO_GPU, proc.stdout + proc.stderr[-2000:]
    assert "flash-attn-4 4.0.0b36 imports next to torch 2.9.1" in proc.stdout
    assert (
        "(4 kernels compiled ahead for H100 (sm_90a, 132 SMs) in" in proc.stdout
        and proc.stdout.rstrip().splitlines()[-1].startswith("NO GPU")
    )


# Every arch class FA4's code runs on, each with its own SM count, as the compat table gives them:
# Ampere (inference only: FA4's backward refuses 8.x), Ada, Hopper, Blackwell, Blackwell workstation.
CLASSES = ("A100:8.0:108", "L4:8.9:58", "H100:9.0:132", "B200:10.0:148", "RTXPRO6000:12.0:188")
FORWARD = ["--head-dims", "128", "--kv-heads", "16", "--causal", "true", "--modes", "infer", "--seqlen", "1024"]


def test_fa4s_kernels_compile_for_every_arch_class_into_one_cache(venv_python: str, fa4_cache, tmp_path: Path) -> None:
    """One cache, one run per GPU (FA4 reads its arch when it is imported): each class's forward is
    compiled and recorded, so a node's check can say which GPUs the image carries kernels for."""
    site, _cache = fa4_cache
    cache = tmp_path / "cache"
    counts = []
    for target in CLASSES:
        proc = run_with_fa4(venv_python, site, ["fa4-cache", "--out", str(cache), "--target", target, *FORWARD], {})
        assert proc.returncode == 0, proc.stderr[-3000:]
        counts.append(fa4.kernels_in(cache))
    assert all(later > earlier for earlier, later in zip([0, *counts], counts)), counts  # each arch its own kernels
    assert [t.argument() for t in fa4.compiled_for(cache)] == list(CLASSES)
    verdicts = {t.name: t.compile_target for t in fa4.compiled_for(cache)}
    assert verdicts == {"A100": "sm_80", "L4": "sm_89", "H100": "sm_90a", "B200": "sm_100a", "RTXPRO6000": "sm_120a"}


def test_a_grid_for_ampere_keeps_its_forward_and_says_why(venv_python: str, fa4_cache, tmp_path: Path) -> None:
    site, _cache = fa4_cache
    cache = tmp_path / "cache"
    both = [*GRID[:-4], "--modes", "train,infer", *GRID[-2:]]
    proc = run_with_fa4(venv_python, site, ["fa4-cache", "--out", str(cache), "--target", "A10G:8.6:80", *both], {})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "A10G (sm_86): 1 of the grid's calls left out: its backward runs on 9.x to 12.x: inference only" in (
        proc.stdout + proc.stderr
    )
    assert fa4.kernels_in(cache) > 0
    trained = run_with_fa4(venv_python, site, ["fa4-cache", "--out", str(cache), "--target", "A10G:8.6:80", *GRID], {})
    assert trained.returncode == 2 and "none of the grid's calls runs there" in trained.stderr

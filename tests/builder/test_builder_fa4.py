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

from fa_images.builder import contract, fa4

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
    proc = run_with_fa4(venv_python, site, ["fa4-cache", "--out", str(cache), "--target", "H100", *GRID], {})
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
    assert "(4 kernels compiled ahead in" in proc.stdout and proc.stdout.rstrip().splitlines()[-1].startswith("NO GPU")

"""FlashAttention-3 through the builder, against the suite's real torch (2.9.1+cu128) and CUDA
toolkit (12.4): its archive made from real git repositories, prepared as the image's builder stage
prepares it, and the compile refused before it starts, with the reason: with CUDA 12.4, FA3's
setup.py would download nvcc 12.6 and ptxas 12.8. The real compile and GPU check ran on an H100
(bench/gpu_container/fa3_check.sh); this machine's toolkit cannot build FA3 without a download."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fixtures import tiny_fa3

from fa_images.builder import fa3, safe_io


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    fa, cutlass, commit = tiny_fa3.make_repos(tmp_path_factory.mktemp("repos"))
    out = safe_io.OutputDir(tmp_path_factory.mktemp("sources"))
    return fa3.make_archive(flash_attention=fa, commit=commit, cutlass=cutlass, out=out)


def test_fa3_is_prepared_for_the_installed_torch(archive, run_fa_images, prepare_only, venv_python, tmp_path) -> None:
    path, sha = archive
    args = prepare_only(
        "--sha256", sha, "--fa3-head-dims", "128", "--fa3-without", "split,sm80",
        out=tmp_path / "out", flash_attn="3.0.0", work=tmp_path / "work", json=True,
    )  # fmt: skip
    proc = run_fa_images([*args, "--sources-dir", path.parent], python=venv_python, module="fa_images.builder")
    assert proc.returncode == 0, proc.stderr
    settings = json.loads(proc.stdout)
    build = fa3.Fa3Build(head_dims=(128,), without=("split", "sm80"))
    assert settings["generation"] == 3 and settings["archs"] == ["90a"] and settings["cuda"] == "12.8"
    assert settings["local_version"] == f"cu12.{build.label()}" and settings["sha256"] == sha
    assert Path(settings["source_dir"]).name == "hopper" and settings["torch"].startswith("2.9.1")


def test_a_cuda_whose_fa3_build_would_download_a_toolchain_is_refused_before_the_compile(
    archive, run_fa_images, venv_python, toolchain_venv: Path, cuda_home: Path, tmp_path: Path
) -> None:
    path, sha = archive
    env = {"CUDA_HOME": str(cuda_home), "PATH": f"{toolchain_venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    args = ["wheel", "--flash-attn", "3.0.0", "--sha256", sha, "--sources-dir", path.parent, "--out", tmp_path / "o"]
    proc = run_fa_images(args, python=venv_python, module="fa_images.builder", env=env)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
    assert len(errors) == 1 and "nvcc 12.4" in errors[0] and "downloads nvcc 12.6 and ptxas 12.8" in errors[0]
    assert not (tmp_path / "o").exists() or not list((tmp_path / "o").glob("*.whl"))

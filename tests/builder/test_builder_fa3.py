"""FlashAttention-3 through the builder, against the suite's real torch (2.9.1+cu128) and CUDA
toolkit (12.4): its archive made from real git repositories (the same bytes from the same commits,
its pin the tar's, a wrong clone refused, a clone read bounded), prepared as the image's builder stage
prepares it, and the compile refused before it starts, with the reason: with CUDA 12.4, upstream's
setup.py would download nvcc 12.6 and ptxas 12.8. A tiny FA3 whose setup.py downloads nothing
(tests/fixtures/tiny_fa3_hopper/) is compiled with the same toolkit into a sound abi3 wheel. The
real compile and GPU check ran on an H100 (bench/gpu_container/fa3_check.sh)."""

from __future__ import annotations

import gzip
import json
import os
import tarfile
from pathlib import Path

import pytest
from fixtures import tiny_fa3

from fa_images.builder import safe_io
from fa_images.builder import source as source_mod
from fa_images.builder.errors import SourceError
from fa_images.builder.generations import fa3


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


def test_a_setup_py_that_downloads_nothing_is_compiled_with_that_cuda_into_a_sound_abi3_wheel(
    run_fa_images, venv_python, toolchain_venv: Path, cuda_home: Path, tmp_path: Path
) -> None:
    fa, cutlass, commit = tiny_fa3.make_repos(tmp_path / "repos", version="3.0.0.dev0", buildable=True)
    path, sha = fa3.make_archive(
        flash_attention=fa, commit=commit, cutlass=cutlass, out=safe_io.OutputDir(tmp_path / "s")
    )
    env = {"CUDA_HOME": str(cuda_home), "PATH": f"{toolchain_venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    args = [
        "wheel",
        "--flash-attn",
        "3.0.0.dev0",
        "--sha256",
        sha,
        "--sources-dir",
        path.parent,
        "--out",
        tmp_path / "o",
    ]
    proc = run_fa_images([*args, "--fa3-without", "sm80"], python=venv_python, module="fa_images.builder", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    label = fa3.local_version_label("12.8", fa3.Fa3Build(without=("sm80",)))
    (wheel,) = (tmp_path / "o").glob("*.whl")
    assert wheel.name.startswith(f"flash_attn_3-3.0.0.dev0+{label}-cp39-abi3-manylinux_2_"), wheel.name
    said = proc.stdout + proc.stderr  # the report and the log go where run_fa_images sends them
    assert "✓ GPU code: sm_90a (cuobjdump)" in said and "✓ import: imports next to torch 2.9.1" in said


# --- the archive, from real git repositories ------------------------------------------------------


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """A cutlass with include/, and a flash-attention whose csrc/cutlass submodule records its commit."""
    return tiny_fa3.make_repos(tmp_path_factory.mktemp("repos"))


def test_the_archive_is_the_same_bytes_from_the_same_commits(repos, tmp_path: Path) -> None:
    fa, cutlass, commit = repos
    first, sha = fa3.make_archive(
        flash_attention=fa, commit=commit, cutlass=cutlass, out=safe_io.OutputDir(tmp_path / "a")
    )
    again, sha2 = fa3.make_archive(
        flash_attention=fa, commit=commit, cutlass=cutlass, out=safe_io.OutputDir(tmp_path / "b")
    )
    assert first.name == "flash_attn_3-3.0.0.tar.gz" and first.read_bytes() == again.read_bytes() and sha == sha2
    with tarfile.open(first) as tar:
        names = tar.getnames()
        assert all(m.mtime == tar.getmembers()[0].mtime and m.uid == 0 for m in tar.getmembers())
    assert "flash_attn_3-3.0.0/csrc/cutlass/include/cutlass/cutlass.h" in names
    assert not any("media.png" in n or "csrc/other" in n for n in names)
    assert source_mod.tar_sha256(first) == sha


def test_the_pin_is_the_tars_so_a_mirror_may_compress_it_again(repos, tmp_path: Path) -> None:
    fa, cutlass, commit = repos
    archive, sha = fa3.make_archive(flash_attention=fa, commit=commit, cutlass=cutlass, out=safe_io.OutputDir(tmp_path))
    plain = tmp_path / "flash_attn_3-3.0.0.tar"
    plain.write_bytes(gzip.decompress(archive.read_bytes()))
    assert source_mod.tar_sha256(plain) == sha
    tree = fa3.unpack(plain, tmp_path / "src", sha)
    assert tree.version == "3.0.0" and tree.path.name == "hopper" and tree.sha256 == sha
    with pytest.raises(SourceError, match="sha256 mismatch"):
        fa3.unpack(archive, tmp_path / "src2", "0" * 64)


def test_a_cutlass_clone_without_the_submodules_commit_is_refused(repos, tmp_path: Path) -> None:
    fa, _cutlass, commit = repos
    empty = tmp_path / "empty"
    empty.mkdir()
    tiny_fa3.git(tmp_path, "init", "-q", str(empty))
    with pytest.raises(SourceError, match="cat-file"):
        fa3.make_archive(flash_attention=fa, commit=commit, cutlass=empty, out=safe_io.OutputDir(tmp_path / "o"))
    assert not (tmp_path / "o" / "flash_attn_3-3.0.0.tar.gz").exists()


def test_a_clone_whose_archive_outgrows_the_bound_is_refused_nothing_written(repos, tmp_path, monkeypatch) -> None:
    fa, cutlass, commit = repos
    monkeypatch.setattr(fa3, "MAX_SOURCE", 64)  # bytes: every archive of the tiny repositories is larger
    with pytest.raises(SourceError, match="took more than 0 MiB; refusing"):
        fa3.make_archive(flash_attention=fa, commit=commit, cutlass=cutlass, out=safe_io.OutputDir(tmp_path / "o"))
    assert not list((tmp_path / "o").iterdir())


def test_nothing_a_clone_carries_runs_while_its_archive_is_made(tmp_path: Path) -> None:
    """A clone's config and attributes name a filter command, its fsmonitor one, its hooks others:
    git runs none of them, since fa-images reads its objects through a repository of its own."""
    fa, cutlass, commit = tiny_fa3.make_repos(tmp_path / "repos")
    ran = tmp_path / "ran"
    (fa / "hopper" / ".gitattributes").write_text("* filter=evil ident export-subst\n")
    tiny_fa3.git(fa, "add", "hopper")  # `add .` would drop the submodule's gitlink
    tiny_fa3.git(fa, "commit", "-qm", "attributes")
    commit = tiny_fa3.git(fa, "rev-parse", "HEAD")
    for clone in (fa, cutlass):
        with (clone / ".git" / "config").open("a") as config:
            config.write(
                f'[filter "evil"]\n\tsmudge = "touch {ran}-smudge; cat"\n\tprocess = "touch {ran}-process"\n'
                f'\trequired = true\n[core]\n\tfsmonitor = "touch {ran}-fsmonitor"\n'
            )
        hooks = clone / ".git" / "hooks"
        for hook in ("post-checkout", "reference-transaction", "pre-auto-gc"):
            (hooks / hook).write_text(f"#!/bin/sh\ntouch {ran}-{hook}\n")
            (hooks / hook).chmod(0o755)
    archive, _sha = fa3.make_archive(
        flash_attention=fa, commit=commit, cutlass=cutlass, out=safe_io.OutputDir(tmp_path / "o")
    )
    assert archive.is_file()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("ran")) == []


def test_a_big_file_in_a_clone_is_streamed_not_held(tmp_path: Path) -> None:
    """A 200 MB file (below the bound) under an address-space cap the old way of holding git's
    output several times over could not stay under: made, in bounded memory."""
    import subprocess
    import sys
    import textwrap

    fa, cutlass, commit = tiny_fa3.make_repos(tmp_path / "repos")
    with (fa / "hopper" / "big.bin").open("wb") as big:
        big.truncate(200 << 20)
    tiny_fa3.git(fa, "add", "hopper")
    tiny_fa3.git(fa, "commit", "-qm", "big")
    commit = tiny_fa3.git(fa, "rev-parse", "HEAD")
    script = textwrap.dedent(
        f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (500 << 20, 500 << 20))  # git's own processes too
        from pathlib import Path
        from fa_images.builder import safe_io
        from fa_images.builder.generations import fa3
        out = safe_io.OutputDir(Path({str(tmp_path / "o")!r}))
        path, sha = fa3.make_archive(flash_attention=Path({str(fa)!r}), commit={commit!r},
                                     cutlass=Path({str(cutlass)!r}), out=out)
        print(path.stat().st_size, sha)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    size, sha = proc.stdout.split()
    assert int(size) < 10 << 20 and len(sha) == 64  # 200 MB of zeros, gzipped


@pytest.mark.parametrize("kind", ["tree", "option"])
def test_a_commit_that_is_no_commit_is_refused_naming_it(repos, tmp_path: Path, kind: str) -> None:
    fa, cutlass, _commit = repos
    value = tiny_fa3.git(fa, "rev-parse", "HEAD^{tree}") if kind == "tree" else "--output=/tmp/x"
    with pytest.raises(SourceError, match=f"--commit '{value}' is not a commit of"):
        fa3.make_archive(flash_attention=fa, commit=value, cutlass=cutlass, out=safe_io.OutputDir(tmp_path / "o"))
    assert not (tmp_path / "o").exists() or not list((tmp_path / "o").iterdir())

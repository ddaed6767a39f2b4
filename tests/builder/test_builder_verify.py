"""The wheel verifier (``fa-images inspect``) and the ELF reader it stands on.

Real binaries throughout: GPU code compiled with the suite's CUDA 12.4 and 13.0 toolkits
(tests/toolchain.py), C++ extensions compiled against this Python's CPU torch with both
C++ ABIs, and small wheels zipped around them to exercise one check at a time.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from fa_images.builder import elf, verify
from fa_images.builder.verify import inspect_wheel

PY = f"{sys.version_info[0]}.{sys.version_info[1]}"
CP = f"cp{sys.version_info[0]}{sys.version_info[1]}"
SO_NAME = f"flash_attn_2_cuda.cpython-{sys.version_info[0]}{sys.version_info[1]}-x86_64-linux-gnu.so"
GENCODE_ARGS = [
    "-gencode",
    "arch=compute_80,code=sm_80",
    "-gencode",
    "arch=compute_90,code=sm_90",
    "-gencode",
    "arch=compute_90,code=compute_90",
]

KERNEL_CU = """\
__global__ void scale(float* x, float s) { x[threadIdx.x] *= s; }
extern "C" void launch(float* x) { scale<<<1, 32>>>(x, 2.f); }
"""


def checks_of(report) -> dict[str, tuple[str, str]]:
    """{check name: (status, detail)}; the last word wins where a check is reported twice."""
    return {c.name: (c.status, c.detail) for c in report.checks}


def json_checks(text: str) -> tuple[dict, dict[str, tuple[str, str]]]:
    data = json.loads(text)
    return data, {c["name"]: (c["status"], c["detail"]) for c in data["checks"]}


def make_wheel(dest: Path, filename: str, files: dict[str, bytes], *, metadata_version: str | None = "") -> Path:
    """A wheel zip named ``filename`` holding ``files`` plus dist-info (METADATA unless None)."""
    name, version = filename.split("-")[:2]
    dist_info = f"{name}-{version}.dist-info"
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / filename
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for arcname, data in files.items():
            zf.writestr(arcname, data)
        if metadata_version is not None:
            zf.writestr(
                f"{dist_info}/METADATA",
                f"Metadata-Version: 2.1\nName: flash_attn\nVersion: {metadata_version or version}\n",
            )
        tag = "-".join(filename.removesuffix(".whl").split("-")[-3:])
        zf.writestr(f"{dist_info}/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tag}\n")
    return path


def relabel_wheel(wheel: Path, dest: Path, new_version: str) -> Path:
    """A copy of ``wheel`` under another version (file name and METADATA), contents unchanged."""
    old_version = wheel.name.split("-")[1]
    out = dest / wheel.name.replace(f"-{old_version}-", f"-{new_version}-")
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith(".dist-info/METADATA"):
                data = re.sub(rb"^Version: .*$", f"Version: {new_version}".encode(), data, flags=re.MULTILINE)
            dst.writestr(info, data)
    return out


def nvcc_shared_library(nvcc: Path, out: Path, *extra: str, gencode: list[str] = GENCODE_ARGS) -> Path:
    """A shared library with GPU code for sm_80, sm_90 and compute_90 PTX (or ``gencode``'s)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    cu = out.with_suffix(".cu")
    cu.write_text(KERNEL_CU)
    cuda_lib = nvcc.parent.parent / "lib64"
    # -cudart none: the registry-built toolkit has no static cudart/cudadevrt to link.
    subprocess.run(
        [
            str(nvcc),
            "-shared",
            "-cudart",
            "none",
            "-Xcompiler",
            "-fPIC",
            *gencode,
            *extra,
            str(cu),
            "-o",
            str(out),
            f"-L{cuda_lib}",
            "-lcudart",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return out


def cuobjdump_archs(cuobjdump: Path, so: Path) -> tuple[set[str], set[str]] | None:
    elfs = subprocess.run([str(cuobjdump), "--list-elf", str(so)], capture_output=True, text=True)
    ptxs = subprocess.run([str(cuobjdump), "--list-ptx", str(so)], capture_output=True, text=True)
    if elfs.returncode != 0 or ptxs.returncode != 0:
        return None
    return (set(re.findall(r"\.sm_(\d+)a?\.cubin", elfs.stdout)), set(re.findall(r"\.sm_(\d+)a?\.ptx", ptxs.stdout)))


def binutils(tool: str) -> str:
    """nm or objdump, the independent readers the ELF reader is checked against (.ci/setup installs binutils)."""
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"no {tool} on PATH: install binutils (.ci/setup does)")
    return path


def nm_undefined(so: Path) -> set[str]:
    out = subprocess.run(
        [binutils("nm"), "-D", "--undefined-only", str(so)], capture_output=True, text=True, check=True
    ).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


# --- the ELF reader on real nvcc output ---------------------------------------------------


@pytest.fixture(scope="module")
def kernel_so(cuda_home: Path, tmp_path_factory) -> Path:
    return nvcc_shared_library(cuda_home / "bin" / "nvcc", tmp_path_factory.mktemp("kernel") / "kernel.so")


@pytest.fixture(scope="module")
def host_only_so(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("host")
    (d / "host.cpp").write_text('#include <string>\nstd::string greet(const std::string& n) { return "hi " + n; }\n')
    subprocess.run(["c++", "-shared", "-fPIC", "-O1", str(d / "host.cpp"), "-o", str(d / "host.so")], check=True)
    return d / "host.so"


def test_fatbin_archs_of_a_cuda_12_library(kernel_so: Path, cuda_home: Path) -> None:
    cubins, ptx = elf.fatbin_archs(kernel_so)
    assert (cubins, ptx) == ({"80", "90"}, {"90"})
    assert cuobjdump_archs(cuda_home / "bin" / "cuobjdump", kernel_so) == (cubins, ptx)


def test_fatbin_archs_of_a_compressed_fatbin(cuda_home: Path, tmp_path: Path) -> None:
    so = nvcc_shared_library(cuda_home / "bin" / "nvcc", tmp_path / "compressed.so", "-Xfatbin", "-compress-all")
    assert elf.fatbin_archs(so) == ({"80", "90"}, {"90"})
    assert cuobjdump_archs(cuda_home / "bin" / "cuobjdump", so) == ({"80", "90"}, {"90"})


@pytest.mark.parametrize(
    "extra", [[], ["--compress-mode=size"], ["--compress-mode=none"]], ids=["default", "size", "none"]
)
def test_fatbin_archs_of_a_cuda13_library(extra: list[str], cuda13_home: Path, cuda_home: Path, tmp_path: Path) -> None:
    """CUDA 13's fatbins (compressed its own way by default; --compress-mode is a CUDA 13 option),
    read as the 12.4 cuobjdump reads them (the 13.0 wheels ship none)."""
    so = nvcc_shared_library(cuda13_home / "bin" / "nvcc", tmp_path / "cuda13.so", *extra)
    assert elf.fatbin_archs(so) == ({"80", "90"}, {"90"})
    assert cuobjdump_archs(cuda_home / "bin" / "cuobjdump", so) == ({"80", "90"}, {"90"})


def test_fatbin_archs_of_a_library_without_gpu_code(host_only_so: Path) -> None:
    assert elf.fatbin_archs(host_only_so) == (set(), set())


def test_elf_reader_refuses_what_is_not_elf(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.so"
    bogus.write_bytes(b"#!/bin/sh\necho not a library\n")
    with pytest.raises(elf.ElfError):
        elf.fatbin_archs(bogus)
    with pytest.raises(elf.ElfError):
        elf.undefined_dynamic_symbols(bogus)


def test_undefined_symbols_agree_with_nm(kernel_so: Path, host_only_so: Path) -> None:
    for so in (kernel_so, host_only_so):
        assert set(elf.undefined_dynamic_symbols(so)) == nm_undefined(so)
    assert "__cudaRegisterFatBinary" in elf.undefined_dynamic_symbols(kernel_so)


def test_gpu_archs_reads_the_same_with_and_without_cuobjdump(
    kernel_so: Path, cuda_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("CUDA_HOME", str(cuda_home))
    with_tool = verify.gpu_archs(kernel_so)
    monkeypatch.setattr(verify, "_cuobjdump", lambda: None)
    without = verify.gpu_archs(kernel_so)
    assert with_tool == ({"80", "90"}, {"90"}, "cuobjdump")
    assert without == ({"80", "90"}, {"90"}, "ELF .nv_fatbin")


# --- small wheels, one problem each -------------------------------------------------------


def test_a_sound_small_wheel_passes_all_but_import(kernel_so: Path, tmp_path: Path) -> None:
    """The control for the tests below: same construction, nothing wrong."""
    wheel = make_wheel(tmp_path, f"flash_attn-2.8.3-{CP}-{CP}-linux_x86_64.whl", {SO_NAME: kernel_so.read_bytes()})
    report = inspect_wheel(wheel, expect_python=PY, expect_archs=("80", "90"), import_check=False)
    assert report.ok, report.lines()
    assert [c.name for c in report.checks] == [
        "platform tag",
        "metadata",
        "torch pin",
        "extension",
        "machine",
        "C++ ABI",
        "GPU code",
        "glibc floor",
        "manylinux",
    ]
    assert (report.cubin_archs, report.ptx_archs) == (["80", "90"], ["90"])
    assert checks_of(report)["machine"] == ("pass", "1 shared libraries for x86_64 (64-bit, little-endian)")


def test_an_x86_64_extension_under_another_cpu_tag_fails_the_machine_check(kernel_so: Path, tmp_path: Path) -> None:
    """The real library nvcc built for this machine, in a wheel tagged for aarch64: both are named."""
    wheel = make_wheel(tmp_path, f"flash_attn-2.8.3-{CP}-{CP}-linux_aarch64.whl", {SO_NAME: kernel_so.read_bytes()})
    status, detail = checks_of(inspect_wheel(wheel, import_check=False))["machine"]
    assert status == "fail"
    assert detail == (
        f"{SO_NAME} is x86_64 (64-bit, little-endian), but its tag linux_aarch64 needs aarch64 (64-bit, little-endian)"
    )


def test_a_pure_python_wheel_is_rejected(kernel_so: Path, tmp_path: Path, run_fa_images) -> None:
    wheel = make_wheel(tmp_path, "flash_attn-2.8.3-py3-none-any.whl", {"flash_attn/__init__.py": b""})
    proc = run_fa_images(["inspect", wheel])
    assert proc.returncode == 1, proc.stderr
    assert f"{wheel.name}: NOT sound" in proc.stdout
    tag_line = next(line for line in proc.stdout.splitlines() if "platform tag" in line)
    assert "✕" in tag_line and "py3-none-any is a pure-Python tag" in tag_line and "build from source" in tag_line
    # Even with the right .so inside, the tag alone condemns it.
    wheel2 = make_wheel(tmp_path / "2", "flash_attn-2.8.3-py3-none-any.whl", {SO_NAME: kernel_so.read_bytes()})
    assert checks_of(inspect_wheel(wheel2, import_check=False))["platform tag"][0] == "fail"


def test_a_wheel_for_another_python_is_rejected(kernel_so: Path, tmp_path: Path) -> None:
    other = "cp312" if CP != "cp312" else "cp313"
    other_py = f"{other[2]}.{other[3:]}"
    wheel = make_wheel(
        tmp_path,
        f"flash_attn-2.8.3-{other}-{other}-linux_x86_64.whl",
        {SO_NAME.replace(CP[2:], other[2:]): kernel_so.read_bytes()},
    )
    report = inspect_wheel(wheel, expect_python=PY, import_check=True)
    status, detail = checks_of(report)["platform tag"]
    assert status == "fail" and f"expected Python {PY}" in detail
    assert checks_of(report)["import"][0] == "skip"  # cannot import a cp312 .so with this Python
    assert checks_of(inspect_wheel(wheel, expect_python=other_py, import_check=False))["platform tag"][0] == "pass"


@pytest.mark.parametrize("tag", [f"{CP}-abi3-linux_x86_64", f"{CP}-{CP}-linux_aarch64", f"{CP}-{CP}-win_amd64"])
def test_other_platform_tags_are_rejected(tag: str, kernel_so: Path, tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path, f"flash_attn-2.8.3-{tag}.whl", {SO_NAME: kernel_so.read_bytes()})
    status, detail = checks_of(inspect_wheel(wheel, import_check=False))["platform tag"]
    assert status == "fail" and "is not cpXY-cpXY-linux_x86_64" in detail


def test_a_wheel_without_the_extension_is_rejected(tmp_path: Path, run_fa_images) -> None:
    wheel = make_wheel(
        tmp_path,
        f"flash_attn-2.8.3-{CP}-{CP}-linux_x86_64.whl",
        {"flash_attn/__init__.py": b"", "flash_attn/flash_attn_interface.py": b""},
    )
    report = inspect_wheel(wheel, expect_python=PY)
    assert not report.ok
    status, detail = checks_of(report)["extension"]
    assert status == "fail" and "no flash_attn_2_cuda." in detail and "no compiled kernels" in detail
    proc = run_fa_images(["inspect", wheel])
    assert proc.returncode == 1 and "Traceback" not in proc.stderr


def test_metadata_that_contradicts_the_file_name(kernel_so: Path, tmp_path: Path) -> None:
    wheel = make_wheel(
        tmp_path,
        f"flash_attn-2.8.3-{CP}-{CP}-linux_x86_64.whl",
        {SO_NAME: kernel_so.read_bytes()},
        metadata_version="2.8.2",
    )
    status, detail = checks_of(inspect_wheel(wheel, import_check=False))["metadata"]
    assert status == "fail" and detail == "file name says 2.8.3, METADATA says 2.8.2"


def test_a_wheel_without_metadata(kernel_so: Path, tmp_path: Path) -> None:
    wheel = make_wheel(
        tmp_path,
        f"flash_attn-2.8.3-{CP}-{CP}-linux_x86_64.whl",
        {SO_NAME: kernel_so.read_bytes()},
        metadata_version=None,
    )
    assert checks_of(inspect_wheel(wheel, import_check=False))["metadata"] == (
        "fail",
        "no flash_attn-2.8.3.dist-info/METADATA",
    )


def test_missing_archs_are_named(kernel_so: Path, tmp_path: Path, run_fa_images) -> None:
    wheel = make_wheel(tmp_path, f"flash_attn-2.8.3-{CP}-{CP}-linux_x86_64.whl", {SO_NAME: kernel_so.read_bytes()})
    status, detail = checks_of(inspect_wheel(wheel, expect_archs=("80", "100", "120"), import_check=False))["GPU code"]
    assert status == "fail" and detail.startswith("missing sm_100, sm_120; has sm_80, sm_90 + PTX 90")
    proc = run_fa_images(["inspect", wheel, "--archs", "8.0,100", "--json"])
    _data, checks = json_checks(proc.stdout)
    assert checks["GPU code"][0] == "fail" and "missing sm_100" in checks["GPU code"][1]


def test_inspect_json(kernel_so: Path, tmp_path: Path, run_fa_images) -> None:
    wheel = make_wheel(tmp_path, f"flash_attn-2.8.3-{CP}-{CP}-linux_x86_64.whl", {SO_NAME: kernel_so.read_bytes()})
    proc = run_fa_images(["inspect", wheel, "--json"])
    assert proc.returncode == 1  # the import fails: kernel.so is no Python module
    data, checks = json_checks(proc.stdout)
    assert data["ok"] is False
    assert data["wheel"] == wheel.name
    assert data["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    assert data["version"] == "2.8.3" and data["tags"] == [f"{CP}-{CP}-linux_x86_64"]
    assert data["extension"] == SO_NAME
    assert (data["cubin_archs"], data["ptx_archs"]) == (["80", "90"], ["90"])
    assert all(set(c) == {"name", "status", "detail"} for c in data["checks"])
    assert {name for name, (status, _d) in checks.items() if status == "fail"} == {"import"}
    assert checks["import"][1].startswith("ImportError")


def test_inspect_of_a_file_that_is_not_a_wheel(tmp_path: Path, run_fa_images) -> None:
    odd = tmp_path / "flash_attn.zip"
    odd.write_bytes(b"PK")
    proc = run_fa_images(["inspect", odd])
    assert proc.returncode == 2 and "not a wheel file name" in proc.stderr and "Traceback" not in proc.stderr
    proc = run_fa_images(["inspect", tmp_path / "missing.whl"])
    assert proc.returncode == 2 and "is not a file" in proc.stderr


@pytest.mark.parametrize("content", ["html", "empty", "truncated"])
def test_a_corrupt_extension_fails_a_check_not_the_tool(
    content: str, host_only_so: Path, tmp_path: Path, run_fa_images
) -> None:
    data = {"html": b"<html>503 Service Unavailable</html>", "empty": b"", "truncated": host_only_so.read_bytes()[:64]}[
        content
    ]
    wheel = make_wheel(tmp_path, f"flash_attn-2.8.3-{CP}-{CP}-linux_x86_64.whl", {SO_NAME: data})
    proc = run_fa_images(["inspect", wheel])
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 1
    assert "NOT sound" in proc.stdout


# --- C++ extensions against this Python's CPU torch, with each C++ ABI --------------------

# flash-attn's flash_api.cpp in small: TORCH_CHECK with a std::string message calls c10's
# torchCheckFail(..., const std::string&), whose mangled name carries the C++ ABI. The
# lean includes (not torch/extension.h) keep each compile near 15 s instead of 45 s.
EXT_SOURCE = """\
#include <pybind11/pybind11.h>
#include <c10/util/Exception.h>
#include <string>
void check(int64_t n) { TORCH_CHECK(n > 0, "n must be positive, got ", std::to_string(n)); }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("check", &check); }
"""

EXT_SETUP = """\
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    name="flash_attn", version="0.0.1", packages=["flash_attn"],
    ext_modules=[CppExtension("flash_attn_2_cuda", ["flash_api.cpp"],
                              extra_compile_args=["-O0", "-D_GLIBCXX_USE_CXX11_ABI={abi}"])],
    cmdclass={{"build_ext": BuildExtension}},
)
"""


@pytest.fixture(scope="session")
def cpu_extension_wheels(tmp_path_factory) -> dict[bool, Path]:
    """{cxx11_abi: flash_attn-0.0.1-cpXY-cpXY-linux_x86_64.whl}, both compiled at once."""
    procs = {}
    root = tmp_path_factory.mktemp("cpu-ext")
    for abi in (False, True):
        src = root / f"abi{int(abi)}"
        (src / "flash_attn").mkdir(parents=True)
        (src / "flash_attn" / "__init__.py").write_text('__version__ = "0.0.1"\n')
        (src / "flash_api.cpp").write_text(EXT_SOURCE)
        (src / "setup.py").write_text(EXT_SETUP.format(abi=int(abi)))
        log = (src / "build.log").open("w")
        procs[abi] = (
            src,
            log,
            subprocess.Popen(
                [sys.executable, "setup.py", "-q", "bdist_wheel", "--dist-dir", str(src / "dist")],
                cwd=src,
                stdout=log,
                stderr=subprocess.STDOUT,
            ),
        )
    wheels = {}
    for abi, (src, log, proc) in procs.items():
        rc = proc.wait(timeout=900)
        log.close()
        assert rc == 0, (src / "build.log").read_text()[-4000:]
        (wheel,) = (src / "dist").glob("*.whl")
        assert wheel.name == f"flash_attn-0.0.1-{CP}-{CP}-linux_x86_64.whl"
        wheels[abi] = wheel
    return wheels


@pytest.fixture(scope="session")
def this_torch(system_torch: dict) -> dict:
    assert system_torch["abi"], (
        f"these tests need a new-ABI torch (every pip torch >= 2.7, as .ci/setup's): {system_torch}"
    )
    return system_torch


@pytest.mark.slow
def test_old_abi_extension_fails_to_import(cpu_extension_wheels, this_torch, run_fa_images) -> None:
    proc = run_fa_images(["inspect", cpu_extension_wheels[False], "--json"])
    assert proc.returncode == 1, proc.stderr
    data, checks = json_checks(proc.stdout)
    assert data["cxx11_abi"] is False
    abi_details = [c["detail"] for c in data["checks"] if c["name"] == "C++ ABI"]
    assert any("old-ABI std::string symbols" in d for d in abi_details), abi_details
    status, detail = checks["import"]
    assert status == "fail"
    # The symbol torch's new-ABI libc10 does not have: a std::string (Ss) parameter.
    assert re.search(r"undefined symbol: _Z\w*Ss\b", detail), detail


@pytest.mark.slow
def test_old_abi_extension_is_named_by_the_abi_check(cpu_extension_wheels, this_torch, run_fa_images) -> None:
    proc = run_fa_images(["inspect", cpu_extension_wheels[False], "--json"])
    _data, checks = json_checks(proc.stdout)
    status, detail = checks["C++ ABI"]
    assert status == "fail" and "cxx11_abi" in detail, checks


@pytest.mark.slow
def test_old_abi_extension_against_the_expected_abi(cpu_extension_wheels, this_torch) -> None:
    report = inspect_wheel(cpu_extension_wheels[False], expect_cxx11_abi=True, import_check=False)
    status, detail = checks_of(report)["C++ ABI"]
    assert status == "fail"
    assert "cxx11_abi=False but torch uses True" in detail and "undefined symbol" in detail


@pytest.mark.slow
def test_old_abi_extension_with_a_new_abi_label(
    cpu_extension_wheels, this_torch, tmp_path: Path, run_fa_images
) -> None:
    labelled = relabel_wheel(cpu_extension_wheels[False], tmp_path, "0.0.1+cu128torch2.13cxx11abitrue")
    proc = run_fa_images(["inspect", labelled])
    assert proc.returncode == 1, proc.stderr
    abi_line = next(line for line in proc.stdout.splitlines() if "C++ ABI" in line)
    assert "✕" in abi_line and re.search(r"cxx11_abi=False but torch \S+ uses True", abi_line), abi_line
    assert re.search(r"✕ import: .*undefined symbol: _Z\w*Ss\b", proc.stdout), proc.stdout


@pytest.mark.slow
def test_new_abi_extension_passes_abi_and_import(cpu_extension_wheels, this_torch, run_fa_images) -> None:
    proc = run_fa_images(["inspect", cpu_extension_wheels[True], "--json"])
    assert proc.returncode == 1, proc.stderr  # no GPU code in a CPU extension: that, and only that, fails
    data, checks = json_checks(proc.stdout)
    assert data["cxx11_abi"] is True
    assert checks["C++ ABI"][0] == "pass" and "std::__cxx11" in checks["C++ ABI"][1]
    assert checks["import"] == ("pass", f"imports next to torch {this_torch['version']}")
    assert {name for name, (status, _d) in checks.items() if status == "fail"} == {"GPU code"}
    assert checks["GPU code"][1].startswith("no GPU code found")


@pytest.mark.slow
def test_abi_symbols_are_read_as_nm_reads_them(cpu_extension_wheels, this_torch, tmp_path: Path) -> None:
    for abi, wheel in cpu_extension_wheels.items():
        with zipfile.ZipFile(wheel) as zf:
            (so_name,) = [n for n in zf.namelist() if n.startswith("flash_attn_2_cuda.")]
            so = Path(zf.extract(so_name, tmp_path / str(abi)))
        symbols = elf.undefined_dynamic_symbols(so)
        assert set(symbols) == nm_undefined(so)
        assert verify.abi_from_symbols(symbols)[0] is abi


# --- the glibc floor: symbol versions read from .gnu.version_r, as objdump reads them -------

FLOOR_CU = """\
#include <string>
#include <stdexcept>
__global__ void scale(float* x, float s) { x[threadIdx.x] *= s; }
std::string launch(float* x, int n) {
  if (n <= 0) throw std::runtime_error("n must be positive, got " + std::to_string(n));
  scale<<<1, 32>>>(x, 2.f);
  return std::to_string(n);
}
"""


def objdump_needed(so: Path) -> dict[str, set[str]]:
    """{library: versions} from `objdump -p`'s "Version References"."""
    out = subprocess.run([binutils("objdump"), "-p", str(so)], capture_output=True, text=True, check=True).stdout
    needed: dict[str, set[str]] = {}
    library = None
    for line in out.split("Version References:", 1)[-1].splitlines():
        if m := re.match(r"\s+required from (\S+):$", line):
            library = m.group(1)
            needed[library] = set()
        elif (m := re.match(r"\s+0x[0-9a-f]+ 0x[0-9a-f]+ \d+ (\S+)$", line)) and library:
            needed[library].add(m.group(1))
    return needed


@pytest.fixture(scope="module")
def nvcc_extension(cuda13_home: Path, tmp_path_factory) -> Path:
    """A C++/CUDA shared library built by nvcc 13.0 (static cudart, as nvcc links by default)."""
    d = tmp_path_factory.mktemp("floor")
    (d / "floor.cu").write_text(FLOOR_CU)
    cmd = [
        str(cuda13_home / "bin" / "nvcc"),
        "-shared",
        "-Xcompiler",
        "-fPIC",
        "-gencode",
        "arch=compute_80,code=sm_80",
    ]
    subprocess.run([*cmd, str(d / "floor.cu"), "-o", str(d / SO_NAME)], check=True, capture_output=True, text=True)
    return d / SO_NAME


def test_the_floor_of_an_nvcc_built_extension_is_read_as_objdump_reads_it(nvcc_extension: Path) -> None:
    expected = objdump_needed(nvcc_extension)
    assert elf.needed_versions(nvcc_extension) == expected
    assert {"libc.so.6", "libstdc++.so.6"} <= set(expected)
    every = {v for versions in expected.values() for v in versions}
    glibc, glibcxx = verify.glibc_floor(nvcc_extension)
    assert glibc == max((v for v in every if re.fullmatch(r"GLIBC_[\d.]+", v)), key=elf.version_key)
    assert glibcxx == max((v for v in every if re.fullmatch(r"GLIBCXX_[\d.]+", v)), key=elf.version_key)


def test_inspect_shows_the_floor_and_this_host_meets_it(nvcc_extension: Path, tmp_path: Path, run_fa_images) -> None:
    wheel = make_wheel(tmp_path, f"flash_attn-2.8.3-{CP}-{CP}-linux_x86_64.whl", {SO_NAME: nvcc_extension.read_bytes()})
    proc = run_fa_images(["inspect", wheel, "--json", "--no-import"])
    data, checks = json_checks(proc.stdout)
    glibc, glibcxx = verify.glibc_floor(nvcc_extension)
    assert (data["glibc_floor"], data["glibcxx_floor"]) == (glibc, glibcxx)
    status, detail = checks["glibc floor"]
    assert status == "pass", detail  # built on this host, so it loads here
    assert detail.startswith(f"needs {glibc}, {glibcxx}; this host has {verify.host_glibc()}")


@pytest.mark.slow
def test_the_floor_of_a_torch_extension(cpu_extension_wheels, this_torch, tmp_path: Path) -> None:
    """The extension built against torch (g++, through torch's BuildExtension), as objdump reads it."""
    with zipfile.ZipFile(cpu_extension_wheels[True]) as zf:
        (so_name,) = [n for n in zf.namelist() if n.startswith("flash_attn_2_cuda.")]
        so = Path(zf.extract(so_name, tmp_path))
    expected = objdump_needed(so)
    assert elf.needed_versions(so) == expected
    assert verify.glibc_floor(so)[1] is not None  # it uses std::string: libstdc++ versions


def test_an_nvcc_built_extension_is_tagged_with_its_policy_and_pip_takes_it(
    nvcc_extension: Path, tmp_path: Path, run_fa_images
) -> None:
    """The floor of this host's build (static cudart, this g++) decides the tag; pip here installs it."""
    from fa_images.builder import manylinux

    policy, why = manylinux.policy_of(nvcc_extension)
    assert policy is not None, why
    record = f"{SO_NAME},,\nflash_attn-2.8.3.dist-info/METADATA,,\nflash_attn-2.8.3.dist-info/RECORD,,\n"
    files = {SO_NAME: nvcc_extension.read_bytes(), "flash_attn-2.8.3.dist-info/RECORD": record.encode()}
    wheel = make_wheel(tmp_path / "built", f"flash_attn-2.8.3-{CP}-{CP}-linux_x86_64.whl", files)
    lines: list[str] = []
    tagged = manylinux.tag_wheel(wheel, lines.append)
    assert tagged.name == f"flash_attn-2.8.3-{CP}-{CP}-{policy}_x86_64.whl", lines
    _data, checks = json_checks(run_fa_images(["inspect", tagged, "--json", "--no-import"]).stdout)
    assert checks["manylinux"] == ("pass", f"{policy} ({why})")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    pip = [sys.executable, "-m", "pip", "--isolated", "--python", str(venv / "bin" / "python"), "install"]
    proc = subprocess.run(
        [*pip, "--no-deps", "--no-index", "--find-links", str(tagged.parent), "flash-attn"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr

"""CUDA's rule for which GPU runs which code (builder/gpuarch.py), and the three places that apply it:
the GPU check (its WRONG ARCH verdict and exit code, before any kernel), `inspect`'s GPU code line
and the executor's skipped gpu-check.

The extensions here are small ELF files with a real ``.nv_fatbin`` section, read by the same
reader the check uses in an image (no cuobjdump there); no GPU is needed.
"""

from __future__ import annotations

import os
import struct
import sys
import types
from pathlib import Path

import pytest
from test_manylinux import a_wheel

from fa_images.builder import contract, elf, generations, gpuarch, gpucheck, verify

H100, A10G, L4, A100, B200, RTX5090 = (9, 0), (8, 6), (8, 9), (8, 0), (10, 0), (12, 0)


@pytest.mark.parametrize(
    ("arch", "capability", "runs"),
    [
        ("80", A100, True),  # the same arch
        ("80", A10G, True),  # same major, higher minor
        ("80", L4, True),
        ("86", A100, False),  # same major, lower minor
        ("80", H100, False),  # a higher major: the G5/G6 image on an H100
        ("90", A10G, False),  # a lower major
        ("90", H100, True),
        ("90a", H100, True),  # arch-specific: that capability only
        ("90a", (9, 1), False),
        ("100a", (10, 3), False),
        ("100a", B200, True),
        ("100f", (10, 3), True),  # family: the same major, a minor as high or higher
        ("103f", B200, False),
        ("120", RTX5090, True),
        ("100", RTX5090, False),
    ],
)
def test_a_cubin_runs_on_its_major_at_its_minor_or_higher(arch: str, capability, runs: bool) -> None:
    assert gpuarch.cubin_runs(arch, capability) is runs
    assert gpuarch.verdict({arch}, set(), capability).runs is runs


@pytest.mark.parametrize(
    ("arch", "capability", "runs"),
    [
        ("80", H100, True),  # PTX is compiled for any newer GPU
        ("80", RTX5090, True),
        ("90", A10G, False),  # never for an older one
        ("90", H100, True),
        ("90a", (10, 0), False),  # arch-specific PTX is not portable forward
    ],
)
def test_ptx_runs_on_its_capability_and_newer(arch: str, capability, runs: bool) -> None:
    assert gpuarch.ptx_runs(arch, capability) is runs


def test_the_verdict_prefers_a_cubin_and_says_when_ptx_is_jit_compiled() -> None:
    both = gpuarch.verdict({"80", "90"}, {"90"}, H100)
    assert both.cubin == "90" and both.jit_ptx is None
    assert both.line().startswith("this GPU (sm_90) runs the sm_90 cubin")
    jit = gpuarch.verdict({"80"}, {"80"}, H100)
    assert jit.runs and jit.cubin is None and jit.jit_ptx == "80"
    assert "runs through PTX compute_80, JIT-compiled" in jit.line()
    assert gpuarch.verdict({"80", "86"}, set(), L4).cubin == "86"  # the newest that fits, as the driver picks


def test_a_gpu_that_runs_nothing_names_both_archs_and_where_it_runs() -> None:
    wrong = gpuarch.verdict({"80"}, set(), H100)
    assert not wrong.runs and wrong.device == "sm_90"
    line = wrong.line()
    assert "this GPU is sm_90; the extension carries sm_80" in line
    assert "8.0 to 8.x (sm_80)" in line and "archs [90]" in line
    other = gpuarch.verdict({"90"}, set(), A10G).line()
    assert "this GPU is sm_86; the extension carries sm_90" in other and "9.0 to 9.x (sm_90)" in other
    assert "9.0 and newer through PTX compute_90" in gpuarch.where_it_runs(set(), {"90"})
    assert gpuarch.where_it_runs({"90a"}, set()) == "9.0 only (sm_90a)"


def test_archs_that_do_not_parse_are_ignored_not_a_crash() -> None:
    assert not gpuarch.verdict({"sm_x", "", "1"}, {"abc"}, H100).runs
    with pytest.raises(ValueError):
        gpuarch.split("9.0;rm")
    assert gpuarch.sorted_archs(["90a", "120", "80", "90", "100f"]) == ["80", "90", "90a", "100f", "120"]


# --- a real fat binary, read as the check reads it in an image ------------------------------------

SHDR = struct.Struct("<IIQQQQIIQQ")


def fatbin(cubins: list[int], ptx: list[int]) -> bytes:
    entries = b""
    for kind, archs in ((elf.FATBIN_KIND_CUBIN, cubins), (elf.FATBIN_KIND_PTX, ptx)):
        for arch in archs:
            header = struct.pack("<HHIQ", kind, 1, 64, 8) + b"\0" * 12 + struct.pack("<I", arch)
            entries += header.ljust(64, b"\0") + b"payload!"
    return struct.pack("<IHHQ", elf.FATBIN_MAGIC, 1, 16, len(entries)) + entries


def extension(cubins: list[int], ptx: list[int] = ()) -> bytes:  # type: ignore[assignment]
    """An ELF64 file with .shstrtab and .nv_fatbin, as nvcc leaves the fat binary in an extension."""
    names = b"\0.shstrtab\0.nv_fatbin\0"
    body = fatbin(cubins, list(ptx))
    data = bytearray(64) + names + body
    shoff = len(data)
    data += bytes(SHDR.size)
    data += SHDR.pack(1, 3, 0, 0, 64, len(names), 0, 0, 1, 0)
    data += SHDR.pack(11, 1, 0, 0, 64 + len(names), len(body), 0, 0, 8, 0)
    data[0:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", data, 0x28, shoff)
    struct.pack_into("<HHH", data, 0x3A, SHDR.size, 3, 1)
    return bytes(data)


def test_the_fat_binary_here_reads_back(tmp_path: Path) -> None:
    so = tmp_path / "flash_attn_2_cuda.so"
    so.write_bytes(extension([80, 90], [90]))
    assert elf.fatbin_archs(so) == ({"80", "90"}, {"90"})


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A flash_attn whose extension is one of these ELF files, on a torch that sees a GPU of ``capability``."""
    import torch

    def install(capability, cubins: list[int], ptx: list[int] = ()) -> list[str]:  # type: ignore[assignment]
        so = tmp_path / "flash_attn_2_cuda.cpython-312-x86_64-linux-gnu.so"
        so.write_bytes(extension(cubins, ptx))
        monkeypatch.setitem(sys.modules, "flash_attn_2_cuda", types.SimpleNamespace(__file__=str(so)))
        monkeypatch.setattr(gpucheck, "import_check", lambda: "flash_attn imports")
        monkeypatch.setattr(gpucheck, "installed", lambda: [generations.FA2])
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda _i=0: capability)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda _i=0: "NVIDIA Test GPU")
        ran: list[str] = []

        def kernels(*_a, **_k):  # a kernel run: recorded, never reached on the wrong arch
            ran.append("kernels")
            return [gpucheck.CaseResult("forward", 0.0, 1.0)]

        monkeypatch.setattr(gpucheck, "dense_cases", kernels)
        monkeypatch.setattr(gpucheck, "varlen_case", lambda: gpucheck.CaseResult("varlen", 0.0, 1.0))
        return ran

    return install


def test_the_check_stops_before_any_kernel_on_a_gpu_that_cannot_run_the_code(installed) -> None:
    ran = installed(H100, [80])
    lines: list[str] = []
    assert gpucheck.run(out=lines.append) == contract.EXIT_WRONG_ARCH == 8
    assert lines[1] == "GPU: NVIDIA Test GPU (sm_90)"
    assert lines[-1].startswith("WRONG ARCH: this GPU is sm_90; the extension carries sm_80")
    assert ran == [] and not any(line.startswith(("PASS", "FAIL")) for line in lines)


def test_the_check_says_when_the_ptx_path_is_what_runs(installed) -> None:
    ran = installed(H100, [80], [80])
    lines: list[str] = []
    assert gpucheck.run(out=lines.append) == 0
    assert "runs through PTX compute_80, JIT-compiled" in lines[2] and ran == ["kernels"]
    assert lines[-1].startswith("PASS")


def test_the_check_runs_the_kernels_where_a_cubin_fits(installed) -> None:
    ran = installed(A10G, [80])
    lines: list[str] = []
    assert gpucheck.run(out=lines.append) == 0
    assert lines[2] == "GPU code: this GPU (sm_86) runs the sm_80 cubin (the extension carries sm_80)"
    assert ran == ["kernels"]


def test_the_check_still_runs_the_kernels_when_the_archs_cannot_be_read(installed, tmp_path: Path) -> None:
    ran = installed(H100, [80])
    (tmp_path / "flash_attn_2_cuda.cpython-312-x86_64-linux-gnu.so").write_bytes(b"\x7fELF not really")
    lines: list[str] = []
    assert gpucheck.run(out=lines.append) == 0 and ran == ["kernels"]
    assert "unreadable); running the kernels" in lines[2]


# --- inspect's GPU code line ---------------------------------------------------------------------


def gpu_code(wheel: Path, gpus) -> tuple[str, str]:
    report = verify.inspect_wheel(wheel, import_check=False, gpus=gpus)
    return {c.name: (c.status, c.detail) for c in report.checks}["GPU code"]


def test_inspect_says_whether_the_gpu_here_can_run_the_wheel(tmp_path: Path) -> None:
    wheel = a_wheel(tmp_path, so=extension([80]))
    status, detail = gpu_code(wheel, [("NVIDIA H100 80GB HBM3", H100)])
    assert status == "pass"  # the wheel is sound; this host is the wrong place to run it
    assert "NVIDIA H100 80GB HBM3 (sm_90) here CANNOT run it: it runs on compute capability 8.0 to 8.x" in detail
    assert gpu_code(wheel, [("NVIDIA A10G", A10G)])[1].endswith("; NVIDIA A10G (sm_86) here runs it (sm_80)")
    assert "here" not in gpu_code(wheel, [])[1]  # no GPU here: nothing to say about one


def test_inspect_asks_nvidia_smi_and_escapes_what_it_prints(tmp_path: Path, monkeypatch) -> None:
    """No GPU here, so nvidia-smi is a stand-in printing what a real one prints for this query."""
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text(
        '#!/bin/sh\n[ "$1" = "--query-gpu=name,compute_cap" ] || exit 9\n'
        'echo "NVIDIA H100 80GB HBM3, 9.0"\nprintf "Evil\\033[2J GPU, 8.6\\n"\necho "garbage"\n'
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    assert gpuarch.visible_gpus() == [("NVIDIA H100 80GB HBM3", H100), ("Evil\x1b[2J GPU", A10G)]
    report = verify.inspect_wheel(a_wheel(tmp_path / "w", so=extension([80])), import_check=False)
    shown = "\n".join(report.lines())
    assert "NVIDIA H100 80GB HBM3 (sm_90) here CANNOT run it" in shown
    assert "\x1b" not in shown and "(sm_86) here runs it (sm_80)" in shown
    assert [g["runs"] for g in report.gpus_here] == [False, True]


def test_the_gpus_that_run_the_code_come_from_a_table_the_caller_gives() -> None:
    table = {"A100": "8.0", "A10G": "8.6", "L4": "8.9", "H100": "9.0", "B200": "10.0", "T4": "7.5", "BAD": "x"}
    assert gpuarch.gpus_that_run({"80"}, set(), table) == ["A100", "A10G", "L4"]
    assert gpuarch.gpus_that_run({"90"}, set(), table) == ["H100"]
    assert gpuarch.gpus_that_run(set(), {"90"}, table) == ["H100", "B200"]


def test_an_arch_number_that_is_no_arch_is_left_out_of_the_messages() -> None:
    """A fatbin may name any number: it is not an arch, and it is no reason to call the ELF unreadable."""
    assert gpuarch.where_it_runs({"7", "80", "1234"}, {"x"}) == "8.0 to 8.x (sm_80)"
    assert gpuarch.where_it_runs({"7"}, set()) == "no GPU"


def test_a_gpu_that_raises_when_asked_is_a_verdict_not_a_crash(installed, monkeypatch) -> None:
    """A GPU visible but busy or lost: reading its capability raises a CUDA error."""
    import torch

    ran = installed(H100, [90])

    def busy(_i=0):
        raise RuntimeError("CUDA error: all CUDA-capable devices are busy or unavailable")

    monkeypatch.setattr(torch.cuda, "get_device_capability", busy)
    lines: list[str] = []
    assert gpucheck.run(out=lines.append) == contract.EXIT_NO_GPU and ran == []
    assert lines[-1].startswith("NO GPU: the GPU cannot be used (RuntimeError: CUDA error: all CUDA-capable")

"""`fa-images doctor` on this machine: the CPU torch, no torch at all, and planted extensions.

The planted extensions are the suite's small `flash_attn_2_cuda` compiled against this
Python's CPU torch with each C++ ABI (see test_builder_verify.py): the old-ABI one fails to
import with the seeds' `undefined symbol`, exactly as a wrongly patched flash-attn does.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from test_builder_verify import EXT_SETUP, EXT_SOURCE

from fa_images.config import compat

BERT_PADDING = "from einops import rearrange\n"


def doctor(run_fa_images, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    proc = run_fa_images(["doctor", "--json", *args], env=env, timeout=600)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def findings(report: dict) -> dict[str, dict]:
    return {f["name"]: f for f in report["findings"]}


def plans(run_fa_images, tmp_path: Path, entry: dict) -> subprocess.CompletedProcess:
    """The suggested entry, pasted into a matrix, through `plan`."""
    from fa_images.doctor import entry_line

    (tmp_path / "matrix.yaml").write_text("entries:\n  - " + entry_line(entry) + "\n")
    return run_fa_images(["plan", "--matrix", tmp_path / "matrix.yaml"])


def test_doctor_with_the_cpu_torch(run_fa_images, tmp_path: Path, system_torch: dict) -> None:
    code, report = doctor(run_fa_images)
    assert code == 1 and report["ok"] is False  # a CPU torch cannot run flash-attn: not "all is well"
    assert report["facts"]["torch"]["version"] == system_torch["version"] and report["facts"]["torch"]["cuda"] is None
    found = findings(report)
    assert found["torch"]["status"] == "warn" and "CPU build" in found["torch"]["detail"]
    assert found["flash-attn"]["detail"] == "not installed for this Python"
    assert report["facts"]["build"]["max_jobs"] >= 1
    entry = report["entry"]
    assert entry["python"] == "{}.{}".format(*sys.version_info[:2])
    assert entry["torch"] == system_torch["version"].split("+")[0] and "cuda" not in entry  # its default CUDA
    assert entry["flash_attn"] == max(compat.load().flash_attn, key=_version)
    proc = plans(run_fa_images, tmp_path, entry)
    assert proc.returncode == 0, proc.stderr
    # The human form names every section and ends in the verdict.
    human = run_fa_images(["doctor"])
    assert human.returncode == 1
    sections = ("✓ Python:", "torch:", "nvcc", "host compiler", "GPUs", "MAX_JOBS=", "matrix entry for this machine")
    for needle in sections:
        assert needle in human.stdout, needle
    assert human.stdout.rstrip().endswith("1 problem: torch")


def test_doctor_with_no_torch_at_all(run_fa_images, tmp_path: Path) -> None:
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    code, report = doctor(run_fa_images, "--python", str(venv / "bin" / "python"))
    assert code == 1, report  # no torch: flash-attn cannot work here
    assert report["facts"]["torch"] is None
    assert "No module named 'torch'" in findings(report)["torch"]["detail"]
    entry = report["entry"]
    table = compat.load()
    newest = max((v for v, r in table.torch.items() if entry["python"] in r.pythons), key=_version)
    assert entry["torch"] == newest
    assert plans(run_fa_images, tmp_path, entry).returncode == 0
    # Issue 30: the finding is one line (no escaped "\\n  hint:" in it), and with no driver seen
    # the suggestion speaks of no driver.
    assert "\\n" not in findings(report)["torch"]["detail"] and "hint" not in findings(report)["torch"]["detail"]
    human = run_fa_images(["doctor", "--python", str(venv / "bin" / "python")], env={"PATH": str(venv / "bin")})
    assert "\\n" not in human.stdout and "this driver" not in human.stdout, human.stdout
    assert f"suggesting torch {newest}, the newest for Python {entry['python']}; no GPU seen here" in human.stdout


def _version(text: str):
    from packaging.version import Version

    return Version(text)


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> dict[bool, Path]:
    """{cxx11_abi: a directory holding an installed flash_attn with its compiled extension}."""
    root = tmp_path_factory.mktemp("doctor-planted")
    procs = {}
    for abi in (False, True):
        src = root / f"src{int(abi)}"
        (src / "flash_attn").mkdir(parents=True)
        (src / "flash_attn" / "__init__.py").write_text('__version__ = "0.0.1"\n')
        # As upstream: bert_padding needs einops, which a --no-deps install leaves out.
        (src / "flash_attn" / "bert_padding.py").write_text(BERT_PADDING)
        (src / "flash_api.cpp").write_text(EXT_SOURCE)
        (src / "setup.py").write_text(EXT_SETUP.format(abi=int(abi)))
        log = (src / "build.log").open("w")
        cmd = [sys.executable, "setup.py", "-q", "bdist_wheel", "--dist-dir", str(src / "dist")]
        procs[abi] = (src, log, subprocess.Popen(cmd, cwd=src, stdout=log, stderr=subprocess.STDOUT))
    out = {}
    for abi, (src, log, proc) in procs.items():
        assert proc.wait(timeout=900) == 0, (src / "build.log").read_text()[-3000:]
        log.close()
        (wheel,) = (src / "dist").glob("*.whl")
        target = root / f"site{int(abi)}"
        with zipfile.ZipFile(wheel) as zf:  # what `pip install --no-deps --target` puts there
            zf.extractall(target)
        out[abi] = target
    return out


@pytest.mark.slow
def test_doctor_names_the_undefined_symbol_of_an_old_abi_extension(planted, run_fa_images) -> None:
    code, report = doctor(run_fa_images, env={"PYTHONPATH": str(planted[False])})
    assert code == 1 and report["ok"] is False
    found = findings(report)
    assert report["facts"]["flash_attn"]["cxx11_abi"] is False
    assert found["flash-attn C++ ABI"]["status"] == "fail"
    assert "cxx11_abi=False but torch" in found["flash-attn C++ ABI"]["detail"]
    failed = found["flash-attn import"]
    assert failed["status"] == "fail"
    assert "undefined symbol _ZN3c10" in failed["detail"] and "Ss" in failed["detail"].split()[2]
    assert "old C++ ABI (cxx11_abi=False)" in failed["detail"]
    assert failed["fix"].startswith("pip uninstall -y flash-attn, then build one for this torch: fa-images wheel")
    human = run_fa_images(["doctor"], env={"PYTHONPATH": str(planted[False])})
    assert human.returncode == 1
    assert "✕ flash-attn import: undefined symbol" in human.stdout and "    fix: pip uninstall" in human.stdout
    assert "3 problems: torch, flash-attn C++ ABI, flash-attn import" in human.stdout


@pytest.mark.slow
def test_doctor_passes_the_right_abi_extension_and_names_a_missing_dependency(planted, run_fa_images) -> None:
    code, report = doctor(run_fa_images, env={"PYTHONPATH": str(planted[True])})
    found = findings(report)
    assert found["flash-attn C++ ABI"]["status"] == "ok"
    # built here, so this host meets its glibc floor; the floor is in the facts
    floor = found["flash-attn glibc floor"]
    assert floor["status"] == "ok" and floor["detail"].startswith("needs GLIBC_2."), floor
    facts = report["facts"]["flash_attn"]
    assert facts["glibc_floor"].startswith("GLIBC_2.") and facts["glibcxx_floor"].startswith("GLIBCXX_3.4")
    assert found["flash-attn import"]["status"] == "ok"
    # Upstream modules this small package lacks are a warning; a missing dependency is a failure.
    assert found["import flash_attn.modules.mha"]["status"] == "warn"
    if importlib.util.find_spec("einops") is None:
        assert code == 1
        einops = found["import flash_attn.bert_padding"]
        assert einops["status"] == "fail" and einops["detail"] == "needs einops, which is not installed"
        pin = next(p for p in compat.load().runtime_deps if p.startswith("einops=="))
        assert einops["fix"] == f"pip install {pin}"
    else:
        # the CPU torch and the stand-in's missing modules are marked !: exit 1 all the same
        assert code == 1 and found["import flash_attn.bert_padding"]["status"] == "ok"


def test_doctor_reads_gpus_and_driver_from_nvidia_smi(run_fa_images, tmp_path: Path) -> None:
    """No GPU here, so nvidia-smi is a stand-in printing what a real one prints for this query."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        '[ "$1" = "--query-gpu=name,compute_cap,driver_version" ] || exit 9\n'
        'echo "NVIDIA H100 80GB HBM3, 9.0, 535.104.05"\n'
        'echo "Tesla T4, 7.5, 535.104.05"\n'
    )
    smi.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    code, report = doctor(run_fa_images, env=env)
    found = findings(report)
    assert code == 1 and report["ok"] is False
    assert found["GPU NVIDIA H100 80GB HBM3"]["status"] == "ok"
    assert found["GPU Tesla T4"]["status"] == "fail" and "needs 8.0 (Ampere)" in found["GPU Tesla T4"]["detail"]
    # Driver 535 cannot run CUDA 13 (>= 580): the entry names a torch whose CUDA it runs, archs from the H100.
    table = compat.load()
    entry = report["entry"]
    cuda = entry.get("cuda", table.torch[entry["torch"]].default_cuda)
    assert int(table.cuda[cuda].min_driver) <= 535
    assert entry["archs"] == [90]
    assert plans(run_fa_images, tmp_path, entry).returncode == 0


def test_doctor_says_which_gpu_here_can_run_the_installed_kernels(run_fa_images, tmp_path: Path) -> None:
    """An installed extension with sm_80 cubins (a real .nv_fatbin, the one test_gpu_arch.py reads) on a
    host with an H100 and an A10G (nvidia-smi is a stand-in): the A10G runs it, the H100 cannot, and
    doctor says so by CUDA's rule, as the GPU check inside an image does."""
    import importlib.machinery

    from test_gpu_arch import extension

    site = tmp_path / "site"
    site.mkdir()
    (site / f"flash_attn_2_cuda{importlib.machinery.EXTENSION_SUFFIXES[0]}").write_bytes(extension([80]))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text('#!/bin/sh\necho "NVIDIA H100 80GB HBM3, 9.0, 570.86.10"\necho "NVIDIA A10G, 8.6, 570.86.10"\n')
    smi.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(site)}
    _code, report = doctor(run_fa_images, env=env)
    found = findings(report)
    h100, a10g = found["flash-attn kernels for NVIDIA H100 80GB HBM3"], found["flash-attn kernels for NVIDIA A10G"]
    assert h100["status"] == "fail" and h100["detail"].startswith("this GPU is sm_90; the extension carries sm_80")
    assert "8.0 to 8.x (sm_80)" in h100["detail"] and h100["fix"].startswith("rebuild with archs [90]")
    assert a10g["status"] == "ok" and a10g["detail"].startswith("this GPU (sm_86) runs the sm_80 cubin")
    assert report["facts"]["flash_attn"]["cubin_archs"] == ["80"]

"""A dist/ of two GPU classes, made here: a tiny CUDA library compiled by nvcc for sm_80 alone and
for sm_90 alone, each in a flash-attn-shaped wheel for this Python, labelled `.sm80` and `.sm90`
as a fleet's matrix labels them, added through fa-images' own dist code (which also makes the
variant twins and every index). For installing from on a real GPU: node_pick.sh.

    python bench/node_pick/two_class_dist.py OUT_DIR [NVCC]
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from fa_images.builder import dist

BASE = "2.8.3+cu130torch2.11cxx11abitrue"
KERNEL = (
    "__global__ void scale(float* x, float s) { x[threadIdx.x] *= s; }\n"
    'extern "C" void launch(float* x) { scale<<<1, 32>>>(x, 2.f); }\n'
)
PY = f"{sys.version_info[0]}{sys.version_info[1]}"


def library(nvcc: str, arch: str, work: Path) -> bytes:
    (work / "k.cu").write_text(KERNEL)
    out = work / f"k{arch}.so"
    subprocess.run([nvcc, "-shared", "-Xcompiler", "-fPIC", "-gencode", f"arch=compute_{arch},code=sm_{arch}",
                    str(work / "k.cu"), "-o", str(out)], check=True)  # fmt: skip
    return out.read_bytes()


def wheel(dest: Path, version: str, so: bytes) -> Path:
    name = f"flash_attn-{version}-cp{PY}-cp{PY}-linux_x86_64.whl"
    info = f"flash_attn-{version}.dist-info"
    files = {
        f"flash_attn_2_cuda.cpython-{PY}-x86_64-linux-gnu.so": so,
        "flash_attn/__init__.py": b"",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: flash_attn\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: false\nTag: cp{PY}-cp{PY}-linux_x86_64\n"
        ).encode(),
    }
    digests = {n: base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b"=").decode() for n, d in files.items()}
    record = [f"{n},sha256={digests[n]},{len(d)}" for n, d in files.items()]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    with zipfile.ZipFile(dest / name, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files.items():
            z.writestr(n, d)
    return dest / name


def main() -> None:
    out, nvcc = Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "nvcc"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for arch in ("80", "90"):
            made = wheel(work, f"{BASE}.sm{arch}", library(nvcc, arch, work))
            record = dist.WheelRecord(
                sha256=hashlib.sha256(made.read_bytes()).hexdigest(), size=made.stat().st_size, flash_attn="2.8.3",
                python=f"{sys.version_info[0]}.{sys.version_info[1]}", torch="2.11.0", cuda="13.0", cxx11_abi=True,
                archs=(arch,), entry=f"fa2.8.3-bench-sm{arch}", image=f"registry.example/fa/flash-attn:bench-sm{arch}",
            )  # fmt: skip
            dist.add_wheels(out, [dist.Incoming(made, record, "bench")])
    print(f"{out}: {', '.join(sorted(p.name for p in out.glob('*.whl')))}")


if __name__ == "__main__":
    main()

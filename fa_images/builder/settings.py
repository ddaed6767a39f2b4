"""The resolved settings of one wheel build, written beside the prepared source.

``prepare`` computes them once; the setup.py shim and the verifier read the same file,
so what was asked, what was compiled and what is checked cannot drift apart.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import gpuarch
from .contract import SETTINGS_FILE, cuda_tag

# flash-attn arch codes the builder compiles; 8.6/8.9 GPUs run the sm_80 kernels. The compat
# table's `archs` is the source; the builder runs inside images without it, so it keeps this
# copy, and a test proves the two agree.
ARCH_CODES = frozenset({"80", "90", "100", "110", "120"})


@dataclass(frozen=True)
class BuildSettings:
    flash_attn: str
    python: str
    torch: str
    cuda: str | None
    cxx11_abi: bool
    archs: tuple[str, ...]
    ptx: bool
    max_jobs: int
    nvcc_threads: int
    local_version: str | None
    source_dir: str
    sdist: str
    sha256: str
    honours_cuda_archs_env: bool
    fetches_toolchain: bool = False  # SourceTree's: its setup.py would download nvcc for some CUDA
    source_date_epoch: int | None = None  # SOURCE_DATE_EPOCH for the wheel (SourceTree)
    parallelism: str = ""  # why MAX_JOBS and NVCC_THREADS are what they are, for the log
    warnings: tuple[str, ...] = field(default=())
    # `wheel --shard I/N`: compile only the I-th of N subsets of the kernels, link nothing (shards.py).
    shard: int = 0
    shards: int = 0
    # The flash-attn generation (generations/), and its own settings where it has any (what it
    # compiles): a build's recipe, its wheel's checks and its record follow both.
    generation: int = 2
    knobs: dict | None = None

    def gencode_flags(self) -> list[str]:
        """nvcc flags for exactly the requested archs, plus PTX of the newest for new GPUs."""
        flags: list[str] = []
        for arch in self.archs:
            flags += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
        for newest in gpuarch.built_ptx(self.archs, self.ptx):
            flags += ["-gencode", f"arch=compute_{newest},code=compute_{newest}"]
        return flags

    def abi_define(self) -> str:
        return f"-D_GLIBCXX_USE_CXX11_ABI={int(self.cxx11_abi)}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    def write(self) -> Path:
        path = Path(self.source_dir) / SETTINGS_FILE
        path.write_text(self.to_json() + "\n")
        return path

    @classmethod
    def read(cls, path: Path) -> BuildSettings:
        raw = json.loads(path.read_text())
        raw["archs"] = tuple(raw["archs"])
        raw["warnings"] = tuple(raw.get("warnings", ()))
        return cls(**raw)


def parse_archs(text: str, known: Collection[str] = ARCH_CODES) -> tuple[str, ...]:
    """'80,90' or '8.0;9.0' or 'sm_80' -> ('80', '90'); sorted, unique, validated against ``known``."""
    archs: set[str] = set()
    for raw in text.replace(";", ",").split(","):
        item = raw.strip().lower().removeprefix("sm_").replace(".", "")
        if not item:
            continue
        if item not in known:
            raise ValueError(
                f"{raw.strip()!r} is not a flash-attn arch; use one of {sorted(known, key=int)} "
                "(8.6 and 8.9 GPUs run the 80 kernels)"
            )
        archs.add(item)
    if not archs:
        raise ValueError("no archs given")
    return tuple(sorted(archs, key=int))


def gpu_class(archs: tuple[str, ...]) -> str:
    """'sm80', 'sm80.120': the GPU class a build of ``archs`` serves, as an entry id, an image tag
    and a wheel's +label carry it where a matrix builds several classes of one torch."""
    return "sm" + ".".join(gpuarch.sorted_archs(archs))


# The GPU class a wheel's +label names, at its end: '2.8.3+cu128torch2.9cxx11abitrue.sm80.120' -> 'sm80.120'.
_CLASS_IN_LABEL = re.compile(r"\.(sm\d{2,3}[af]?(?:\.\d{2,3}[af]?)*)", re.ASCII)
# A GPU class as a folder name (dist/sm80/simple/): the same text, alone.
GPU_CLASS = re.compile(r"sm\d{2,3}[af]?(?:\.\d{2,3}[af]?)*", re.ASCII)


def gpu_class_of(local_label: str | None) -> str | None:
    """The GPU class a wheel's local version label names ('sm80'), None where it names none: a
    wheel for every GPU its archs run on."""
    found = _CLASS_IN_LABEL.search(local_label or "")
    return found[1] if found and found.end() == len(local_label or "") else None


def local_version_label(*, cuda: str | None, torch: str, cxx11_abi: bool, archs: tuple[str, ...] = ()) -> str:
    """'cu128torch2.9cxx11abitrue': what the wheel is for, in its file name and metadata; with
    ``archs``, its GPU class too ('cu128torch2.9cxx11abitrue.sm120'), which pip and uv match as a
    local version like any other, so a node asks for the one it runs."""
    torch_mm = ".".join(torch.split("+")[0].split(".")[:2])
    cuda_part = cuda_tag(cuda) if cuda else "cpu"
    label = f"{cuda_part}torch{torch_mm}cxx11abi{str(cxx11_abi).lower()}"
    return f"{label}.{gpu_class(archs)}" if archs else label

"""The GPUs and AWS instance families the compat table knows, what a flash-attn build needs for
each, and which of them a matrix's entries run on (``fa-images gpus``)."""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import Version

from .compat import Compat, arch_runs_on
from .model import Entry


@dataclass(frozen=True, kw_only=True)
class GpuRow:
    gpu: str
    capability: str
    arch: str | None  # the flash-attn 2 arch whose kernels it runs; None: too old for flash-attn
    families: tuple[str, ...]  # AWS instance families with this GPU
    aarch64: tuple[str, ...]  # of those, the Grace ones: listed, not built here
    runs: tuple[str, ...] | None  # the matrix's entries that run on it; None without a matrix
    oldest: str  # the oldest capability flash-attn 2 runs on (Compat.fa2_min_capability)

    @property
    def need(self) -> str:
        return f"sm_{self.arch}" if self.arch else f"none (needs {self.oldest}+)"

    def summary(self) -> dict:
        data = {
            "gpu": self.gpu,
            "compute_capability": self.capability,
            "arch": self.arch,
            "instance_families": list(self.families),
            "aarch64_families": list(self.aarch64),
        }
        if self.runs is not None:
            data["entries"] = list(self.runs)
        return data


def rows(compat: Compat, entries: tuple[Entry, ...] | None = None) -> list[GpuRow]:
    """One row per GPU of the table, by compute capability; with ``entries``, which run on it."""
    out = []
    for gpu, capability in sorted(compat.gpus.items(), key=lambda kv: (Version(kv[1]), kv[0])):
        arch = compat.fa2_arch(capability)
        families = compat.families_of(gpu)
        runs = None
        if entries is not None:
            runs = tuple(e.id for e in entries if arch and arch_runs_on(e.archs, capability, ptx=e.ptx))
        out.append(
            GpuRow(
                gpu=gpu,
                capability=capability,
                arch=arch,
                families=families,
                aarch64=tuple(f for f in families if compat.instances[f].cpu != "x86_64"),
                runs=runs,
                oldest=compat.fa2_min_capability,
            )
        )
    return out


def families(table: list[GpuRow]) -> tuple[list[str], list[str]]:
    """(the x86_64 instance families some entry runs on, those flash-attn runs on and none does)."""
    covered: list[str] = []
    missed: list[str] = []
    for r in table:
        if r.arch and r.runs is not None:
            built = [f for f in r.families if f not in r.aarch64]
            (covered if r.runs else missed).extend(built)
    return covered, missed

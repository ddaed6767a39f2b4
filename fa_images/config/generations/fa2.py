"""flash-attn 2 on the host: PyPI's sdist, compiled for the archs its target's GPUs need, one wheel
per Python, torch series, CUDA and C++ ABI (and GPU class, where a matrix builds several)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

from ...builder import generations, setup_shim
from ...builder.settings import local_version_label
from .recipe import Recipe, Versions, Work

if TYPE_CHECKING:
    from ..compat import Compat
    from ..expand import Combo
    from ..model import Entry
    from ..resolve import EntryResolver

GENERATION = generations.FA2
SECTION = None
TABLE = None  # its sdists' pins are the compat table's own flash_attn: section
STARTER = ""  # what `init` adds to a starter matrix of it: nothing, the starter is flash-attn 2's


def class_of(compat: Compat, gpu: str) -> str:
    """The kernels a GPU needs: its arch ('80' serves every 8.x GPU); one entry per class."""
    return compat.arch_for_capability(compat.capability_of(gpu) or "") or ""


@cache
def _arch_core_seconds() -> float:
    """The measured compile seconds of all of flash-attn's kernels, for one arch: read once."""
    return float(sum(json.loads(setup_shim.COSTS_FILE.read_text())["kernels"].values()))


@dataclass(frozen=True)
class Fa2Recipe(Recipe):
    generation = GENERATION

    def wheel_label(self, entry: Entry, cxx11_abi: bool | None = None) -> str:
        """Torch series, CUDA, C++ ABI, and its GPU class where the matrix builds several."""
        abi = entry.cxx11_abi if cxx11_abi is None else cxx11_abi
        archs = entry.archs if entry.gpu_class else ()
        return local_version_label(cuda=entry.cuda, torch=entry.torch, cxx11_abi=bool(abi), archs=archs)

    def wheel_labels(self, entry: Entry) -> set[str]:
        abis = (True, False) if entry.cxx11_abi is None else (entry.cxx11_abi,)
        return {self.wheel_label(entry, abi) for abi in abis}

    def compile_group(self, entry: Entry) -> str:
        """Entries that differ only in Python share their kernels: no kernel includes Python.h (the
        devel base is a function of the CUDA version within one matrix, so it is covered)."""
        archs = "_".join(entry.archs) + ("-ptx" if entry.ptx else "")
        return f"fa{entry.flash_attn}-torch{entry.torch}-{entry.cuda_tag}-sm{archs}"

    def wheel_flags(self, entry: Entry, *, index_url: str) -> list[tuple[str, ...]]:
        flags = [("--index-url", index_url), ("--archs", ",".join(entry.archs))]
        return flags + ([("--label-archs",)] if entry.gpu_class else [])

    def work(self, entry: Entry) -> Work:
        targets = len(entry.archs) + int(entry.ptx)
        what = f"compiles {targets} arch(s) of flash-attn's kernels"
        return Work(_arch_core_seconds() * targets, targets, 0.0, what, shardable=True)


def resolve(resolver: EntryResolver, combo: Combo, v: Versions, before: int) -> Entry | None:
    """A flash-attn 2 entry: its archs from `archs` or its target's GPUs, the CUDA they need, the
    sdist the table pins."""
    ptx = combo.values.get("ptx", resolver.build_opts.ptx)
    archs, gpus = resolver.archs_for(combo, ptx=ptx is True) or ((), ())
    resolver.check_python(combo, v.python)
    if len(resolver.problems) == before and v.python and v.torch and combo.ruled:
        reason = resolver.left_out_reason(combo, v.python, v.torch, v.cuda, archs)
        if resolver.left_out_because(combo, reason):
            return None
    release, cuda, cuda_note = resolver.torch_release(combo, v.python, v.torch, v.cuda, archs)
    cuda_rel = resolver.cuda_release(combo, cuda, v.torch)
    resolver.check_flash_attn(combo, v.flash_attn)
    resolver.check_archs(combo, archs, cuda)
    if not isinstance(ptx, bool):
        resolver.fail(combo, "ptx", f"ptx must be true or false, not {ptx!r}")
    fa = v.flash_attn
    if len(resolver.problems) > before or not (v.python and v.torch and fa and cuda and cuda_rel and archs):
        return None
    fa_rel = resolver.compat.flash_attn.get(fa)
    return resolver.made(
        combo,
        v,
        cuda=cuda,
        cuda_rel=cuda_rel,
        archs=archs,
        ptx=bool(ptx),
        gpus=gpus,
        release=release,
        sha256=fa_rel.sha256 if fa_rel else None,
        recipe=Fa2Recipe(),
        cuda_note=cuda_note,
    )

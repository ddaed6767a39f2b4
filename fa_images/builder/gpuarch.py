"""Can this GPU run the extension's code? CUDA's rule, in one place for `check`, `inspect` and `doctor`.

A cubin ``sm_XY`` runs on a GPU of the same major X and a minor of Y or more (sm_80 on 8.0, 8.6
and 8.9, not on 9.0). An arch-specific cubin ``sm_XYa`` (sm_90a, sm_100a) runs on compute
capability X.Y only; a family cubin ``sm_XYf`` (CUDA 12.9+) on the same major with a minor of Y
or more. PTX ``compute_XY`` is compiled by the driver (JIT) for any GPU of capability X.Y or
newer; arch-specific PTX follows its cubin's rule. The driver takes a cubin that fits before PTX.

Archs are strings as the extension names them: '80', '90a', '100f'; a capability is (major, minor).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ARCH = re.compile(r"(?P<number>\d{2,3})(?P<variant>[af]?)")


def split(arch: str) -> tuple[int, int, str]:
    """'90a' -> (9, 0, 'a'); '100f' -> (10, 0, 'f'); '86' -> (8, 6, ''). ValueError otherwise."""
    match = _ARCH.fullmatch(arch.strip().lower().removeprefix("sm_").removeprefix("compute_"))
    if not match:
        raise ValueError(f"{arch!r} is not a GPU arch such as 80, 90a or 100f")
    number = int(match["number"])
    return number // 10, number % 10, match["variant"]


def sort_key(arch: str) -> tuple[int, int, str]:
    """Orders archs as numbers, a plain arch before its 'a' and 'f' variants; unknown text last."""
    try:
        return split(arch)
    except ValueError:
        return (1 << 30, 0, arch)


def sorted_archs(archs) -> list[str]:
    return sorted(archs, key=sort_key)


def built_ptx(archs, ptx: bool) -> tuple[str, ...]:
    """The PTX a build of ``archs`` carries: with ``--ptx``, that of its newest arch (for newer GPUs)."""
    return (max(archs, key=int),) if ptx and archs else ()


def capability_arch(capability: tuple[int, int]) -> str:
    """(9, 0) -> 'sm_90'."""
    return f"sm_{capability[0]}{capability[1]}"


def cubin_runs(arch: str, capability: tuple[int, int]) -> bool:
    major, minor, variant = split(arch)
    if variant == "a":
        return capability == (major, minor)
    return capability[0] == major and capability[1] >= minor


def ptx_runs(arch: str, capability: tuple[int, int]) -> bool:
    major, minor, variant = split(arch)
    if variant:  # arch-specific PTX is not portable forward: the cubin's rule
        return cubin_runs(arch, capability)
    return tuple(capability) >= (major, minor)


def _known(archs) -> list[str]:
    """The archs that read as archs, in order: an extension's fatbin may name any number."""
    return [a for a in sorted_archs(archs) if sort_key(a)[0] != 1 << 30]


def where_it_runs(cubins, ptx) -> str:
    """The compute capabilities the code runs on, for a message: '8.0 to 8.x (sm_80); 9.0 and newer
    through PTX compute_90'."""
    parts = []
    for arch in _known(cubins):
        major, minor, variant = split(arch)
        if variant == "a":
            parts.append(f"{major}.{minor} only (sm_{arch})")
        else:
            parts.append(f"{major}.{minor} to {major}.x (sm_{arch})")
    for arch in _known(ptx):
        major, minor, variant = split(arch)
        if variant:
            parts.append(f"{major}.{minor}{' only' if variant == 'a' else f' to {major}.x'} (PTX compute_{arch})")
        else:
            parts.append(f"{major}.{minor} and newer through PTX compute_{arch}")
    return "; ".join(parts) or "no GPU"


def code_text(cubins, ptx) -> str:
    """'sm_80, sm_90 + PTX compute_90', or 'no GPU code'."""
    text = ", ".join(f"sm_{a}" for a in sorted_archs(cubins))
    if ptx:
        text += (" + " if text else "") + ", ".join(f"PTX compute_{a}" for a in sorted_archs(ptx))
    return text or "no GPU code"


@dataclass(frozen=True)
class ArchVerdict:
    """What a GPU of ``capability`` runs of the extension's code: a cubin, PTX through the JIT, or nothing."""

    capability: tuple[int, int]
    cubins: tuple[str, ...]
    ptx: tuple[str, ...]
    cubin: str | None = None  # the cubin the driver loads, when one fits
    jit_ptx: str | None = None  # else the PTX it compiles

    @property
    def runs(self) -> bool:
        return self.cubin is not None or self.jit_ptx is not None

    @property
    def device(self) -> str:
        return capability_arch(self.capability)

    def line(self) -> str:
        """One sentence: how the code runs on this GPU, or why it cannot and where it can."""
        carries = code_text(self.cubins, self.ptx)
        if self.cubin is not None:
            return f"this GPU ({self.device}) runs the sm_{self.cubin} cubin (the extension carries {carries})"
        if self.jit_ptx is not None:
            return (
                f"this GPU ({self.device}) runs through PTX compute_{self.jit_ptx}, JIT-compiled by the driver "
                f"on first use (no cubin fits; the extension carries {carries})"
            )
        return (
            f"this GPU is {self.device}; the extension carries {carries}, which runs on compute capability "
            f"{where_it_runs(self.cubins, self.ptx)}: check it on such a GPU, or build it with archs "
            f"[{self.capability[0]}0] for this one"
        )


def verdict(cubins, ptx, capability: tuple[int, int]) -> ArchVerdict:
    """The rule applied: the newest cubin that fits (the driver's choice), else the newest PTX that
    fits. Archs that do not parse are ignored (they come from a file fa-images did not make)."""

    def valid(archs) -> list[str]:
        out = []
        for arch in archs:
            try:
                split(arch)
            except ValueError:
                continue
            out.append(arch)
        return sorted_archs(out)

    cubin_list, ptx_list = valid(cubins), valid(ptx)
    capability = (int(capability[0]), int(capability[1]))
    cubin = next((a for a in reversed(cubin_list) if cubin_runs(a, capability)), None)
    jit = None if cubin else next((a for a in reversed(ptx_list) if ptx_runs(a, capability)), None)
    return ArchVerdict(capability, tuple(cubin_list), tuple(ptx_list), cubin, jit)


# nvidia-smi's line: the name may hold commas, the compute capability may not.
_SMI_LINE = re.compile(r"(?P<name>.+),\s*(?P<major>\d+)\.(?P<minor>\d+)")


def visible_gpus(timeout: float = 20) -> list[tuple[str, tuple[int, int]]]:
    """(name, capability) of each GPU nvidia-smi lists here; [] without nvidia-smi, a driver or a GPU.
    Asks no torch: ``inspect`` works where none is installed."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        proc = subprocess.run(
            [smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    if proc.returncode != 0:
        return []
    found = []
    for line in proc.stdout.splitlines()[:64]:
        match = _SMI_LINE.fullmatch(line.strip()[:256])
        if match:
            found.append((match["name"].strip(), (int(match["major"]), int(match["minor"]))))
    return found


def gpus_that_run(cubins, ptx, gpus: dict[str, str]) -> list[str]:
    """The names of ``gpus`` (name -> compute capability '8.6', as the host's compat table lists
    them) that run this code: where to check an image that this GPU cannot run."""
    found = []
    for name, capability in gpus.items():
        major, _, minor = str(capability).partition(".")
        if major.isdigit() and minor.isdigit() and verdict(cubins, ptx, (int(major), int(minor))).runs:
            found.append(name)
    return found

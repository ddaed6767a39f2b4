"""`fa-images pick`: which image and wheel a node takes, by its GPU or AWS instance family.

A matrix (what a build makes) or a dist/ (what one made) offers an image and a wheel per entry;
a node takes the offers whose kernels run on its GPU (CUDA's rule, ``compat.arch_runs_on``), and
its wheel from the index of its GPU class (``dist.indexes``): pip and uv rank local labels as
text, so from the one index every node would take the newest class's wheel.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import parse_wheel_filename

from ..builder import dist, generations
from ..errors import UsageError
from .compat import Compat, arch_runs_on, did_you_mean, gpu_key
from .model import Entry


@dataclass(frozen=True, kw_only=True)
class Node:
    """The GPU a node has, as it was named: an instance family, a GPU, or a compute capability."""

    asked: str
    gpu: str  # the table's name, or 'sm_86' for a capability the table has no name for
    capability: str
    families: tuple[str, ...]

    def describe(self) -> str:
        families = f", AWS {', '.join(self.families)}" if self.families else ""
        named = self.gpu if gpu_key(self.asked) == gpu_key(self.gpu) else f"{self.asked}: {self.gpu}"
        return f"{named} (compute capability {self.capability}{families})"


@dataclass(frozen=True, kw_only=True)
class Offer:
    """One entry's image and wheel, from a matrix or from a dist/'s manifest."""

    entry: str
    python: str
    torch: str | None
    cuda: str | None
    flash_attn: str
    generation: int
    archs: tuple[str, ...]
    ptx: bool
    image: str | None
    requirement: str
    index: str | None  # dist/'s folder of the index that serves its wheel; None: the package index's
    wheel: str | None = None  # its file name, where a dist/ records it
    pushed: str | None = None  # its image's digest in the registry, where the build pushed it

    def runs_on(self, capability: str) -> bool:
        return arch_runs_on(self.archs, capability, ptx=self.ptx)

    def lines(self, base: str) -> dict[str, str]:
        """The commands a node runs: the pull of its image, the pip and uv installs of its wheel."""
        where = f"--index-url {base.rstrip('/')}/{self.index} " if self.index else ""
        lines = {"pull": f"docker pull {self.image}"} if self.image else {}
        lines["pip"] = f"pip install {where}'{self.requirement}'"
        lines["uv"] = f"uv pip install {where}'{self.requirement}'"
        if self.index and self.index != dist.SIMPLE:  # a class's wheel: also its variant twin, from the one index
            shared = self.requirement.removesuffix(f".{self.index.split('/')[0]}")
            one_index = f"{base.rstrip('/')}/{dist.SIMPLE}"
            lines["uv-variants"] = (
                f"uv pip install --preview-features wheel-variants --index-url {one_index} '{shared}'"
            )
        return lines

    def summary(self, base: str) -> dict:
        return {
            "entry": self.entry,
            "python": self.python,
            "torch": self.torch,
            "cuda": self.cuda,
            "flash_attn": self.flash_attn,
            "generation": self.generation,
            "archs": list(self.archs),
            "image": self.image,
            "requirement": self.requirement,
            "index_url": f"{base.rstrip('/')}/{self.index}/" if self.index else None,
            **self.lines(base),
        }


def node(compat: Compat, name: str) -> Node:
    """The node a name stands for: an instance family ('g6e'), a GPU ('L40S') or 'sm_89'/'8.9'."""
    family = compat.instances.get(name.strip().lower())
    gpu = family.gpu if family else name.strip()
    if family is not None and family.cpu != "x86_64":
        raise UsageError(f"{name} is an {family.cpu} instance family ({gpu}): fa-images builds x86_64 images")
    capability = compat.capability_of(gpu)
    if capability is None:
        raise UsageError(
            f"{name!r} is not a GPU, an AWS instance family or a compute capability the compat table knows",
            hint=did_you_mean(name, sorted(compat.instances) + sorted(compat.gpus)) or "e.g. g6e, L40S, sm_89 or 8.9",
        )
    known = gpu_key(gpu) in compat.gpus
    shown_gpu = gpu_key(gpu) if known else f"sm_{capability.replace('.', '')}"
    return Node(asked=name.strip(), gpu=shown_gpu, capability=capability, families=compat.families_of(shown_gpu))


def named(compat: Compat, smi_name: str, capability: str) -> str:
    """The table's GPU that nvidia-smi's name holds ('NVIDIA H100 80GB HBM3' -> 'H100'; the longest
    of those that match, so an A10G is no A10) at that capability, else the capability itself."""
    said = gpu_key(smi_name)
    held = [gpu for gpu, cc in compat.gpus.items() if cc == capability and gpu in said]
    return max(held, key=len) if held else capability


def from_entries(entries: Iterable[Entry]) -> list[Offer]:
    return [
        Offer(
            entry=e.id,
            python=e.python,
            torch=e.torch,
            cuda=e.cuda,
            flash_attn=e.flash_attn,
            generation=e.generation.number,
            archs=e.archs,
            ptx=e.ptx,
            image=e.image,
            requirement=e.requirement,
            index=e.wheel_index,
        )
        for e in entries
    ]


def from_dist(directory: Path) -> list[Offer]:
    """The wheels a dist/ holds, each with the image its record names."""
    if not directory.is_dir():
        raise UsageError(f"--dist {directory} is not a directory (give the dist/ that `fa-images build` wrote)")
    return from_manifest(dist.read_manifest(directory), str(directory))


def from_manifest(manifest: dist.Manifest, where: str) -> list[Offer]:
    """The wheels a dist/'s manifest records (a folder's, or a published site's), each with its image."""
    if not manifest.wheels:
        raise UsageError(f"{where} holds no wheels ({dist.MANIFEST} records none)")
    offers = []
    for name, record in sorted(manifest.wheels.items()):
        project, version, _build, _tags = parse_wheel_filename(name)
        gen = generations.of_project(project)
        offers.append(
            Offer(
                entry=record.entry or name,
                python=record.python,
                torch=record.torch,
                cuda=record.cuda,
                flash_attn=record.flash_attn,
                generation=gen.number if gen else 2,
                archs=record.archs,
                ptx=bool(record.ptx),
                image=record.image,
                requirement=f"{project}=={version}",
                index=dist.index_of(name),
                wheel=name,
                pushed=record.pushed,
            )
        )
    return offers


def pick(offers: list[Offer], at: Node, *, python: str | None = None, torch: str | None = None) -> list[Offer]:
    """The offers that run on the node, of its Python and torch where they are given."""
    return [
        o
        for o in offers
        if o.runs_on(at.capability)
        and (python is None or o.python == python)
        and (torch is None or (o.torch or "").split("+")[0] == torch)
    ]


def nearest(offers: list[Offer], compat: Compat) -> str:
    """What the offers run on instead, for a refusal: the instance families first, then how many
    other GPUs ('g5 (A10G), g6 (L4), p5 (H100) and 9 other GPUs')."""
    gpus = [gpu for gpu, capability in compat.gpus.items() if any(o.runs_on(capability) for o in offers)]
    families = [f"{f} ({i.gpu})" for f, i in compat.instances.items() if i.cpu == "x86_64" and gpu_key(i.gpu) in gpus]
    others = [gpu for gpu in gpus if not compat.families_of(gpu)]
    if not families:
        return ", ".join(others) or "no GPU the compat table knows"
    return ", ".join(families) + (f" and {len(others)} other GPUs (fa-images gpus --matrix)" if others else "")

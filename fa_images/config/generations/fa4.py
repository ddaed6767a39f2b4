"""FlashAttention-4 on the host: Python on NVIDIA's CuTe DSL, installed from the index with the set
pinned for the torch's CUDA major, its kernels compiled into the image with no GPU for each GPU of
the target (its capability and SM count, from the compat table's gpus:), for the ``fa4:`` grid."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from packaging.version import Version

from ...builder import generations, gpuarch
from ...builder.generations import fa4
from ...builder.wording import counted
from .. import tablecheck
from .recipe import InstallStage, Recipe, Section, Versions, Work

if TYPE_CHECKING:
    from ..compat import Compat
    from ..expand import Combo
    from ..model import Entry
    from ..resolve import EntryResolver

GENERATION = generations.FA4
FIELDS: dict[str, Any] = {
    "head_dims": [int], "dtypes": [str], "causal": [bool], "kv_heads": [int], "heads": int, "batch": int,
    "seqlen": int, "modes": [str],
}  # fmt: skip
SECTION = Section(
    key="fa4",
    settings=fa4.Fa4Grid,
    fields=FIELDS,
    example="e.g. fa4: {head_dims: [64, 128], dtypes: [bf16], kv_heads: [16, 4], heads: 16, seqlen: 2048}",
    about="the calls whose FlashAttention-4 kernels every FA4 image carries compiled",
)
# Where its image keeps its kernels, compiled ahead.
CACHE = "/opt/fa4-cache"
TABLE = "flash_attn_4"  # its releases in the compat table
# What `init` adds to a starter matrix of it: its grid, commented.
STARTER = """
# FlashAttention-4's kernels are compiled ahead, for each GPU of the target, for these calls
# (the defaults); a call of another shape compiles at its first call, as without fa-images:
# fa4:
#   head_dims: [64, 128]
#   dtypes: [bf16]
#   causal: [false, true]
#   kv_heads: [16, 4]        # of 16 query heads: MHA and GQA 4:1
#   modes: [train, infer]
"""


def class_of(compat: Compat, gpu: str) -> str:
    """Its kernels are compiled for each GPU's own arch (sm_86, sm_89, sm_90a): one entry per arch."""
    found = target(compat, gpu)
    return found if isinstance(found, str) else found.compile_target


@dataclass(frozen=True, kw_only=True)
class Release:
    """A release: the set pip resolves for it, pinned, per CUDA major of torch ("13")."""

    version: str
    pins: dict[str, tuple[str, ...]]


def load_releases(c: tablecheck.Checker, raw_table: Any) -> dict[str, Release]:
    """The compat table's flash_attn_4: section, every problem reported."""
    found = {}
    for ver, raw in c.mapping((TABLE,), raw_table).items():
        ver = c.key((TABLE, ver), ver)
        raw = c.mapping((TABLE, ver), raw)
        if ver is not None and Version(ver).major != GENERATION.number:
            c.fail((TABLE, ver), f"{TABLE}: {ver} is not a {GENERATION.name} version (4.x)")
            continue
        pins = {}
        for key, value in raw.items():
            major = str(key).removeprefix("cuda")
            if not (str(key).startswith("cuda") and major.isdigit()):
                c.fail((TABLE, ver, key), f"{TABLE}.{ver}.{key}: keys are cuda12, cuda13, ...")
                continue
            pins[major] = tablecheck.pins(c, (TABLE, ver, key), value)
            if ver is not None and f"{GENERATION.project}=={ver}" not in pins[major]:
                c.fail((TABLE, ver, key), f"{TABLE}.{ver}.{key} must pin {GENERATION.project}=={ver} itself")
        if ver is not None:
            found[ver] = Release(version=ver, pins=pins)
    return found


def releases(compat: Compat) -> dict[str, Release]:
    return compat.releases.get(TABLE, {})


@dataclass(frozen=True)
class Fa4Recipe(Recipe):
    generation = GENERATION
    makes_wheel = False
    source = None
    grid: fa4.Fa4Grid
    targets: tuple[fa4.Fa4Target, ...]  # the GPUs its kernels are compiled for
    pins: tuple[str, ...] = ()  # flash-attn-4 and the set pip resolves for it, for the torch's CUDA major

    def wheel_label(self, entry: Entry) -> None:
        return None

    def wheel_labels(self, entry: Entry) -> set[str]:
        return set()

    def compile_group(self, entry: Entry) -> str:
        return f"fa{entry.flash_attn}-{entry.id}"  # nothing compiles with nvcc: a group of its own

    def wheel_flags(self, entry: Entry, *, index_url: str) -> list[tuple[str, ...]]:
        return []

    def work(self, entry: Entry) -> Work:
        calls = len(self.grid.points()) * len(self.targets)
        what = f"compiles FA4's {counted(calls, 'call')} ahead ({counted(len(self.targets), 'GPU')}), one at a time"
        return Work(0.0, 1, calls * fa4.SECONDS_PER_CALL, what)

    def summary(self) -> dict[str, Any]:
        return {"fa4": asdict(self.grid)}

    def labels(self, entry: Entry, runtime: tuple[str, ...]) -> dict[str, str]:
        return {
            "fa-images.generation": "4",
            "fa-images.fa4-grid": self.grid.describe(),
            "fa-images.fa4-cache": self.fingerprint(entry, runtime),
            "fa-images.fa4-targets": ",".join(t.argument() for t in self.targets),
        }

    def runtime_pins(self) -> tuple[str, ...]:
        return self.pins

    def fingerprint(self, entry: Entry, runtime: tuple[str, ...]) -> str:
        """What its kernel cache is made of, as 16 hex digits for its label: the pinned set (FA4's
        sources and the DSL's versions), the Python, the grid and the GPUs compiled for. Two images
        with the same one carry the same kernels."""
        made_of = [runtime, entry.python, self.grid.to_json(), [t.argument() for t in self.targets]]
        return hashlib.sha256(repr(made_of).encode()).hexdigest()[:16]

    def install_stage(self, entry: Entry, runtime: tuple[str, ...]) -> InstallStage:
        return InstallStage(
            "compiled_ahead.j2",
            about=(
                f"{self.generation.project} and its pinned set installed on torch, pip check, its kernels compiled",
                f"for the matrix's {SECTION.key}: grid with no GPU (fake tensors), import check",
            ),
            values={
                "command": "fa4-cache",
                "section": SECTION.key,
                "cache": CACHE,
                "targets": [t.argument() for t in self.targets],
                "grid": self.grid.arguments(),
            },
            env={fa4.CACHE_ON_ENV: "1", fa4.CACHE_ENV: CACHE},
        )

    def notes(self, entry: Entry) -> list[str]:
        shown = []
        for target in self.targets:
            why = fa4.refused("train", target.major) if "train" in self.grid.modes else None
            shown.append(f"{target.name} ({target.compile_target}, {target.sms} SMs" + (f"; {why})" if why else ")"))
        return [f"FlashAttention-4 {entry.id} compiles its grid ahead for {', '.join(shown)}"]

    def farm_problem(self) -> str | None:
        return (
            "FlashAttention-4 makes no wheel for a node to compile (it is Python, from the index, its kernels "
            "compiled into its image): build its image with `fa-images build`"
        )


def resolve(resolver: EntryResolver, combo: Combo, v: Versions, before: int) -> Entry | None:
    """A FlashAttention-4 entry: its pinned set for the torch's CUDA major, and its kernels compiled
    into the image for each GPU of the target (its capability and SM count: target())."""
    grid: fa4.Fa4Grid = resolver.settings_of(SECTION)
    for key in ("archs", "ptx"):
        if key in combo.values:
            resolver.fail(combo, key, f"{key} is not for FlashAttention-4: its kernels are compiled for the target")
    targets = _targets(resolver, combo, grid)
    python, torch_v, fa = v.python, v.torch, v.flash_attn
    if python is not None and (python not in resolver.compat.pythons or Version(python) < Version("3.10")):
        resolver.fail(combo, "python", f"FlashAttention-4 needs Python >= 3.10 (its DSL's wheels), not {python}")
    release, cuda, _ = resolver.torch_release(combo, python, torch_v, v.cuda)
    cuda_rel = resolver.cuda_release(combo, cuda, torch_v)
    fa_rel = releases(resolver.compat).get(fa) if fa else None
    if fa and fa_rel is None:
        known = ", ".join(releases(resolver.compat)) or "none"
        resolver.fail(
            combo,
            "flash_attn",
            f"FlashAttention-4 {fa} is not in the compat table (flash_attn_4:)",
            hint=f"known: {known}",
        )
    major = cuda.split(".")[0] if cuda else None
    if fa_rel is not None and major is not None and major not in fa_rel.pins:
        majors = ", ".join(f"CUDA {m}" for m in fa_rel.pins)
        resolver.fail(
            combo,
            "cuda" if "cuda" in combo.values else "torch",
            f"FlashAttention-4 {fa} has no pinned set for CUDA {major} (the table has {majors})",
            hint=_cuda_hint(resolver, fa_rel.pins, torch_v),
        )
    if len(resolver.problems) > before or not (python and torch_v and fa and fa_rel and cuda and cuda_rel and targets):
        return None
    # Its kernels run where they were compiled for: each GPU's own arch ('90a': 9.0 only).
    archs = tuple(gpuarch.sorted_archs({t.compile_target.removeprefix("sm_") for t in targets}))
    return resolver.made(
        combo,
        v,
        cuda=cuda,
        cuda_rel=cuda_rel,
        archs=archs,
        ptx=False,
        gpus=tuple(t.name for t in targets),
        release=release,
        sha256=None,
        recipe=Fa4Recipe(grid, targets, fa_rel.pins.get(major or "", ())),
    )


def _cuda_hint(resolver: EntryResolver, pinned: dict, torch_v: str | None) -> str:
    """Where FA4 works today: this torch's own build for a CUDA it has a pinned set for, else the
    torch releases that have one."""
    own = resolver.compat.torch.get(torch_v or "")
    same = [v.cuda for v in own.variants if v.cuda.split(".")[0] in pinned] if own else []
    if same:
        return f'torch {torch_v} has a CUDA {same[-1]} build: write cuda: "{same[-1]}"'
    works = [
        f"{t.version} (CUDA {v.cuda})"
        for t in resolver.compat.torch.values()
        for v in t.variants
        if v.cuda.split(".")[0] in pinned
    ]
    if not works:
        return "add a pinned set with --compat FILE"
    return f"use a torch built for CUDA {', '.join(pinned)}, such as torch " + ", ".join(works[-3:])


def target(compat: Compat, gpu: str) -> fa4.Fa4Target | str:
    """The GPU as its kernels are compiled ahead for it (its capability and SM count, which FA4's
    heuristics read), or why they cannot be."""
    found = compat.gpu(gpu)
    if found is None:
        return f"{gpu} is not a GPU of the compat table's gpus section, whose SM count FA4's kernels are chosen by"
    if found.major not in fa4.MAJORS:
        return f"FlashAttention-4 runs on compute capability 8.x to 12.x; {gpu} is {found.capability}"
    if found.sms is None:
        return (
            f"the compat table has no SM count for {gpu}, which FA4's kernels are chosen by: "
            f'give it with --compat FILE (gpus: {{{found.name}: {{capability: "{found.capability}", sms: N}}}})'
        )
    return fa4.Fa4Target(found.name, found.capability, found.sms)


def _targets(resolver: EntryResolver, combo: Combo, grid: fa4.Fa4Grid) -> tuple[fa4.Fa4Target, ...] | None:
    """The target's GPUs as FA4's kernels are compiled for them: each one's capability and SM
    count from the compat table (``target``)."""
    if "target" not in combo.values:
        resolver.fail(combo, None, "no target: name the GPUs its kernels are compiled for", hint="e.g. target: [H100]")
        return None
    found = resolver.target_gpus(combo, "FlashAttention-4")
    if found is None:
        return None
    targets = [target(resolver.compat, gpu) for gpu, _cc, _arch in found]
    refused = [why for why in targets if isinstance(why, str)]
    refused += [
        f"{t.name} runs none of the grid's calls ({fa4.refused('train', t.major)})"
        for t in targets
        if not isinstance(t, str) and not grid.points(t.major)
    ]
    if refused:
        resolver.fail(combo, "target", f"FlashAttention-4's kernels cannot be compiled ahead: {'; '.join(refused)}")
        return None
    return tuple({t.name: t for t in targets if not isinstance(t, str)}.values())

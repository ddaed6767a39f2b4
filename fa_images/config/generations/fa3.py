"""FlashAttention-3 on the host: its pinned source archive (found in packages.sdists only), the
knobs of ``fa3:`` and the GPUs its kernels run on (sm_90a: 9.0; sm_80: 8.x), one abi3 wheel per
compile group on torch's stable ABI, built once by the entry with the oldest torch."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from packaging.version import Version

from ...builder import generations
from ...builder.generations import fa3
from .. import grammar, tablecheck
from .recipe import Recipe, Section, Versions, Work

if TYPE_CHECKING:
    from ..compat import Compat
    from ..expand import Combo
    from ..model import Entry
    from ..resolve import EntryResolver

GENERATION = generations.FA3
SECTION = Section(
    key="fa3",
    settings=fa3.Fa3Build,
    fields={"head_dims": [int], "dtypes": [str], "without": [str]},
    example="e.g. fa3: {head_dims: [128], dtypes: [bf16, fp16], without: [split, paged_kv]}",
    about="what every FlashAttention-3 entry compiles; upstream's full build where it is absent",
)


TABLE = "flash_attn_3"  # its releases in the compat table
# What `init` adds to a starter matrix of it: where its archive is found, and its knobs, commented.
STARTER = """
# FlashAttention-3 is on no index: its source archive is made once from two clones, and found in
# packages.sdists (`fa-images source fa3 --flash-attention CLONE --cutlass CLONE --out sources/`).
packages:
  sdists: sources
# What it compiles: upstream's full build (about 293 kernels, hours on few cores) unless trimmed:
# fa3:
#   head_dims: [128]         # of 64, 96, 128, 192, 256
#   dtypes: [bf16, fp16]     # of bf16 (always), fp16, fp8
#   without: [split, paged_kv, append_kv, local, softcap, packgqa, sm80, hdim_diff]
"""


def class_of(compat: Compat, gpu: str) -> str:
    """Its kernels are the same for every GPU it runs on (sm_80 and sm_90a): one class."""
    return ""


_COMMIT = re.compile(r"[0-9a-f]{40}", re.ASCII)


@dataclass(frozen=True, kw_only=True)
class Release:
    """A release: its source archive's pin (the tar's sha256) and the commits it is made of."""

    version: str
    sha256: str
    flash_attention: str  # the flash-attention commit (hopper/)
    cutlass: str  # the cutlass commit of its csrc/cutlass submodule
    runtime_deps: tuple[str, ...]  # what its wheel requires besides torch and runtime_deps, pinned


def load_releases(c: tablecheck.Checker, raw_table: Any) -> dict[str, Release]:
    """The compat table's flash_attn_3: section, every problem reported."""
    found = {}
    for ver, raw in c.mapping((TABLE,), raw_table).items():
        ver = c.key((TABLE, ver), ver)
        raw = c.mapping((TABLE, ver), raw)
        if ver is not None and Version(ver).major != GENERATION.number:
            c.fail((TABLE, ver), f"{TABLE}: {ver} is not a {GENERATION.name} version (3.x)")
            continue
        bad = [k for k in ("sha256", "flash_attention", "cutlass") if not isinstance(raw.get(k), str)]
        bad += [k for k in ("flash_attention", "cutlass") if k not in bad and not _COMMIT.fullmatch(raw[k])]
        if "sha256" not in bad and not grammar.SHA256.fullmatch(raw["sha256"]):
            bad.append("sha256")
        for key in bad:
            what = "64 hex digits" if key == "sha256" else "a full commit (40 hex digits)"
            c.fail((TABLE, ver, key), f"{TABLE}.{ver}.{key} must be {what}")
        deps = tablecheck.pins(c, (TABLE, ver, "runtime_deps"), raw.get("runtime_deps", []))
        if ver is None or bad:
            continue
        found[ver] = Release(
            version=ver,
            sha256=raw["sha256"],
            flash_attention=raw["flash_attention"],
            cutlass=raw["cutlass"],
            runtime_deps=deps,
        )
    return found


def releases(compat: Compat) -> dict[str, Release]:
    return compat.releases.get(TABLE, {})


@dataclass(frozen=True)
class Fa3Recipe(Recipe):
    generation = GENERATION
    source = "archive"
    build: fa3.Fa3Build
    runtime_deps: tuple[str, ...] = ()

    def wheel_label(self, entry: Entry) -> str:
        """'cu13', or 'cu13.k1a2b3c4d' for a trimmed build: one abi3 wheel serves a whole CUDA major."""
        return fa3.local_version_label(entry.cuda, self.build)

    def wheel_labels(self, entry: Entry) -> set[str]:
        return {self.wheel_label(entry)}

    def compile_group(self, entry: Entry) -> str:
        """Every Python and torch of a CUDA major: the group is named by what it compiles."""
        archs = "_".join(entry.archs)
        return f"fa{entry.flash_attn}-{self.wheel_label(entry)}-sm{archs}"

    def wheel_flags(self, entry: Entry, *, index_url: str) -> list[tuple[str, ...]]:
        return [tuple(self.build.arguments())]  # no index serves its archive: packages.sdists does

    def work(self, entry: Entry) -> Work:
        units = len(self.build.sources())
        return Work(units * fa3.KERNEL_SECONDS, 1, 0.0, f"compiles {units} FlashAttention-3 kernels")

    def summary(self) -> dict[str, Any]:
        return {"fa3": {"build": self.build.describe(), **{k: list(v) for k, v in asdict(self.build).items()}}}

    def labels(self, entry: Entry, runtime: tuple[str, ...]) -> dict[str, str]:
        return {"fa-images.generation": "3", "fa-images.fa3-build": self.build.describe()}

    def runtime_pins(self) -> tuple[str, ...]:
        return self.runtime_deps

    def notes(self, entry: Entry) -> list[str]:
        full = " (upstream's full build)" if self.build.full else ""
        kernels = ", ".join(f"sm_{a}" for a in self.build.archs)
        return [f"FlashAttention-3 builds {self.build.describe()}{full}: one abi3 wheel per compile group, {kernels}"]

    def shard_problem(self) -> str | None:
        return "FlashAttention-3 is built unsharded (its setup.py compiles every kernel in one run)"

    def source_name(self, version: str) -> str:
        return fa3.archive_name(version)


def resolve(resolver: EntryResolver, combo: Combo, v: Versions, before: int) -> Entry | None:
    """A FlashAttention-3 entry: torch's stable ABI (torch >= 2.9), a CUDA its setup.py builds with
    and nothing downloaded, and the GPUs its kernels run on (sm_90a: 9.0; sm_80: 8.x)."""
    build: fa3.Fa3Build = resolver.settings_of(SECTION)
    for key in ("archs", "ptx"):
        if key in combo.values:
            resolver.fail(
                combo, key, f"{key} is not for FlashAttention-3: its kernels are sm_90a and sm_80, as fa3: says"
            )
    gpus = _gpus(resolver, combo, build)
    resolver.check_python(combo, v.python)
    if len(resolver.problems) == before and v.python and v.torch and combo.ruled:
        reason = _left_out_reason(resolver, combo, v.python, v.torch, v.cuda)
        if resolver.left_out_because(combo, reason):
            return None
    release, cuda, _ = resolver.torch_release(combo, v.python, v.torch, v.cuda)
    cuda_rel = resolver.cuda_release(combo, cuda, v.torch)
    fa = v.flash_attn
    fa_rel = releases(resolver.compat).get(fa) if fa else None
    if fa and fa_rel is None:
        known = list(releases(resolver.compat))
        resolver.fail(
            combo,
            "flash_attn",
            f"FlashAttention-3 {fa} is not in the compat table (flash_attn_3:)",
            hint=f"known: {', '.join(known) or 'none'}; add it with --compat FILE",
        )
    if v.torch and Version(v.torch) < fa3.STABLE_ABI_TORCH:
        resolver.fail(
            combo,
            "torch",
            f"FlashAttention-3 is built on torch's stable ABI, from torch {fa3.STABLE_ABI_TORCH}; not {v.torch}",
        )
    if cuda and (why := fa3.refuse_cuda(cuda)):
        resolver.fail(combo, "cuda" if "cuda" in combo.values else "torch", why)
    if len(resolver.problems) > before or not (
        v.python and v.torch and fa and fa_rel and cuda and cuda_rel and gpus is not None
    ):
        return None
    return resolver.made(
        combo,
        v,
        cuda=cuda,
        cuda_rel=cuda_rel,
        archs=build.archs,
        ptx=False,
        gpus=gpus,
        release=release,
        sha256=fa_rel.sha256,
        recipe=Fa3Recipe(build, fa_rel.runtime_deps),
    )


def _gpus(resolver: EntryResolver, combo: Combo, build: fa3.Fa3Build) -> tuple[str, ...] | None:
    """The target's GPUs, each one FA3's kernels run on: 9.0 (sm_90a), 8.x (sm_80, unless left out)."""
    if "target" not in combo.values:
        resolver.fail(combo, None, "no target: name the GPUs it is for", hint="e.g. target: [H100]")
        return None
    found = resolver.target_gpus(combo)
    if found is None:
        return None
    for gpu, cc, _arch in found:
        if not runs_on(build, cc):
            why = (
                "its sm_80 kernels are left out (fa3.without: sm80)"
                if cc.startswith("8.")
                else "FA3's kernels are sm_90a (9.0 only) and sm_80 (8.x)"
            )
            resolver.fail(combo, "target", f"FlashAttention-3 cannot run on {gpu} (compute capability {cc}): {why}")
            return None
    return tuple(gpu for gpu, _, _ in found)


def runs_on(build: fa3.Fa3Build, capability: str) -> bool:
    """Whether the build's kernels run on a GPU of that compute capability."""
    return capability == "9.0" or (capability.startswith("8.") and "80" in build.archs)


def _left_out_reason(resolver: EntryResolver, combo: Combo, python: str, torch_v: str, cuda: str | None) -> str | None:
    release = resolver.compat.torch.get(torch_v)
    if release is None:
        return None
    if "torch" in combo.ruled and Version(torch_v) < fa3.STABLE_ABI_TORCH:
        return f"FlashAttention-3 is built on torch's stable ABI, from torch {fa3.STABLE_ABI_TORCH}"
    if combo.ruled & {"python", "torch"} and python not in release.pythons:
        return f"torch {torch_v} has no wheels for Python {python}"
    given = combo.values.get("cuda") is not None
    cuda = cuda if given else release.default_cuda
    if ("cuda" in combo.ruled if given else "torch" in combo.ruled) and cuda and release.variant(cuda) is None:
        return f"torch {torch_v} has no CUDA {cuda} build"
    if ("cuda" in combo.ruled if given else "torch" in combo.ruled) and cuda and (why := fa3.refuse_cuda(cuda)):
        return why
    return None

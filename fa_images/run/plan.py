"""The plan: which steps run for which entry, computed before anything runs.

Each entry's plan names what the executor will do, and nothing it does is decided elsewhere:
the Dockerfile stages, the one build that makes them all and the tag it gets, what is taken
from the stages it built (a tag, the wheel, the compiler cache), the check commands run in the
image, and the refs pushed. ``fa-images build --dry-run``
prints it (``--json`` serializes it). Entries that differ only in Python form a compile group
(``Entry.compile_group``, the ``group`` key): they run one after the other and share a compiler
cache, so the kernels compile once per group.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from ..builder import contract
from ..config import groups
from ..config.grammar import BuilderForm
from ..config.matrix import Entry
from .current import Wheel

StepName = Literal["source", "build", "export", "check", "gpu-check", "push", "attest"]
# In order. "gpu-check" is reported as skipped when the engine has no GPU runtime.
STEPS: tuple[StepName, ...] = get_args(StepName)

# The stages of every rendered Dockerfile, in the order they appear (uv-python too with bases.python: uv).
STAGES = (
    contract.PYTHON_STAGE,
    contract.TORCH_STAGE,
    contract.BUILDER_STAGE,
    contract.WHEEL_STAGE,
    contract.CACHE_STAGE,
    contract.INSTALL_STAGE,
    contract.RUNTIME_STAGE,
)
# Those of a runtime image made around a wheel that already exists: nothing compiles.
PREBUILT_STAGES = tuple(s for s in STAGES if s not in (contract.BUILDER_STAGE, contract.CACHE_STAGE))
# A generation that makes no wheel: Python from the index, its kernels compiled in the install stage.
PYTHON_STAGES = tuple(s for s in PREBUILT_STAGES if s != contract.WHEEL_STAGE)
# BuildKit's form: the compile's cache is a cache mount, which two stages fill from the host's copy
# and read back into the cache stage.
BUILDKIT_STAGES = (
    *STAGES[: STAGES.index(contract.CACHE_STAGE)],
    contract.CACHE_IN_STAGE,
    contract.CACHE_OUT_STAGE,
    *STAGES[STAGES.index(contract.CACHE_STAGE) :],
)
# And with two bases, the compile mounting the torch stage's venv: the stages that commit it first.
BUILDKIT_TWO_BASE_STAGES = (
    *BUILDKIT_STAGES[: BUILDKIT_STAGES.index(contract.TORCH_STAGE) + 1],
    contract.TORCH_COMMITTED_STAGE,
    contract.TORCH_COMMIT_STAGE,
    *BUILDKIT_STAGES[BUILDKIT_STAGES.index(contract.TORCH_STAGE) + 1 :],
)


@dataclass(frozen=True, kw_only=True)
class BuildTarget:
    """A stage of the entry's Dockerfile and what becomes of it: the build's target, tagged
    ``tag``, or a stage that build made on its way, tagged or read (``tag`` None)."""

    stage: str
    tag: str | None
    purpose: str
    # Built anew in a build of its own, never answered by the build cache: its files come from a
    # cache mount, whose content no cache key covers.
    anew: bool = False
    # A help, not a result (the compiler cache's way in and out): when it cannot be made, the
    # entry still succeeds and its report says why.
    best_effort: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "tag": self.tag,
            "purpose": self.purpose,
            "anew": self.anew,
            "best_effort": self.best_effort,
        }


@dataclass(frozen=True, kw_only=True)
class CheckCommand:
    """A command run in a container of the entry's image; it passes when it exits 0."""

    step: StepName
    what: str  # how errors name it
    command: tuple[str, ...]
    gpus: str | None = None  # how the container gets the GPUs (--gpus runtime or devices); None: no GPUs
    no_gpu_exit: int | None = None  # this exit code means "no GPU here": skipped, not failed

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "what": self.what,
            "command": list(self.command),
            "gpus": self.gpus,
            "no_gpu_exit": self.no_gpu_exit,
        }


@dataclass(frozen=True, kw_only=True)
class EntryPlan:
    entry: Entry
    steps: tuple[StepName, ...]
    build: BuildTarget  # the one build of the "build" step: every stage, up to the runtime image
    # Built before it, each in a build of its own (BuildKit's form): the torch stage that the compile
    # mounts, and, anew, compiler-cache-in where the host keeps a compiler cache.
    before: tuple[BuildTarget, ...] = ()
    from_stages: tuple[BuildTarget, ...]  # what is then taken from the stages that build made
    checks: tuple[CheckCommand, ...]  # one per check step that runs
    push: tuple[str, ...]  # the refs the "push" step pushes
    # Refs in a registry whose build cache the build may take (BuildKit's inline cache): those it
    # pushes, so a host with empty storage finds what another host built and pushed.
    cache_from: tuple[str, ...] = ()
    bases: tuple[str, ...]  # the base images the build starts from
    prebuilt: Path | None = None  # a verified wheel the image is made around, instead of a compile
    # Or the wheel a published index serves for the entry (final: never compiled again), fetched
    # and verified only if the image must be built.
    published: Wheel | None = None
    # Or the wheel of its compile group, which another entry compiles (an abi3
    # wheel serves every Python and torch of a CUDA major): that entry's id. dist/ holds the wheel once.
    shares_wheel_of: str | None = None
    form: BuilderForm  # the Dockerfile form of the builder that builds it

    @property
    def around_wheel(self) -> bool:
        """The image is made around a wheel that exists: no compile, no devel base."""
        return self.prebuilt is not None or self.published is not None or self.shares_wheel_of is not None

    @property
    def stages(self) -> tuple[str, ...]:
        if not self.entry.recipe.makes_wheel:
            return PYTHON_STAGES
        if self.around_wheel:
            return PREBUILT_STAGES
        if self.form != "buildkit":
            return STAGES
        return BUILDKIT_STAGES if self.entry.same_base else BUILDKIT_TWO_BASE_STAGES

    @property
    def tags(self) -> tuple[str, ...]:
        return tuple(t.tag for t in (self.build, *self.from_stages) if t.tag)

    @property
    def files(self) -> tuple[str, ...]:
        """The stages whose files the executor takes (the wheel, the compiler cache)."""
        return tuple(t.stage for t in self.from_stages if t.tag is None)

    @property
    def best_effort(self) -> frozenset[str]:
        return frozenset(t.stage for t in (*self.before, *self.from_stages) if t.best_effort)

    @property
    def anew(self) -> frozenset[str]:
        return frozenset(t.stage for t in (*self.before, *self.from_stages) if t.anew)

    def check(self, step: StepName) -> CheckCommand | None:
        """The command of check step ``step``; None where it runs none (the GPU check with --gpus none)."""
        return next((c for c in self.checks if c.step == step), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.entry.summary(),
            "steps": list(self.steps),
            "stages": list(self.stages),
            "prebuilt": str(self.prebuilt) if self.prebuilt else None,
            "published": self.published.location if self.published else None,
            "shares_wheel_of": self.shares_wheel_of,
            "builder": self.form,
            "bases": list(self.bases),
            "before": [t.to_dict() for t in self.before],
            "build": self.build.to_dict(),
            "from_stages": [t.to_dict() for t in self.from_stages],
            "tags": list(self.tags),
            "checks": [c.to_dict() for c in self.checks],
            "push": list(self.push),
            "cache_from": list(self.cache_from),
        }

    def describe(self) -> list[str]:
        """The plan as a person reads it: one line per build, check and push."""
        lines = [f"{self.entry.id}: {' -> '.join(self.steps)}"]
        if self.entry.recipe.source is None:  # its source step fetches nothing: the build installs from the index
            lines.append(
                f"  source     {self.entry.requirement} and its pinned set from the index, in the build (no sdist)"
            )
        if self.prebuilt:
            lines.append(f"  wheel      {self.prebuilt}  (made around it: no compile)")
        if self.published:
            lines.append(f"  wheel      {self.published.location}  (published: made around it, no compile)")
        if self.shares_wheel_of and not self.prebuilt:
            lines.append(f"  wheel      {self.shares_wheel_of}'s, this run  (one compile serves the group: no compile)")
        elif self.shares_wheel_of:
            lines[-1] += f": the group's, recorded for {self.shares_wheel_of}"
        width = max(len(t.stage) for t in (*self.before, self.build, *self.from_stages))
        for t in self.before:
            lines.append(f"  before     --target {t.stage:<{width}}  {t.purpose}{_notes(t)}")
        build = f"--target {self.build.stage:<{width}}"
        lines.append(f"  build      {build}  {self.build.tag}  (every stage, in one build)")
        for t in self.from_stages:
            what = "tagged " + t.tag if t.tag else t.purpose + _notes(t)
            lines.append(f"  stage      {t.stage:<{width + 9}}  {what}")
        for c in self.checks:
            note = _GPU_NOTES[c.gpus] if c.gpus else ""
            lines.append(f"  {c.step:<9}  {shlex.join(c.command)}{note}")
        if "gpu-check" in self.steps and self.check("gpu-check") is None:
            lines.append("  gpu-check  skipped: --gpus none")
        for ref in self.push:
            lines.append(f"  push       {ref}")
        # fa-images' own statements for every builder form: BuildKit's --sbom/--provenance do not survive
        # the engine's image store (--load drops them), and the legacy builder and Podman have none.
        if "attest" in self.steps and self.entry.recipe.makes_wheel:
            lines.append("  attest     the wheel's SBOM, provenance and GPU verdict, signed, beside it in dist/")
        if "attest" in self.steps and self.push:
            lines.append(
                f"  attest     {self.entry.image}: its SBOM, provenance and GPU verdict, fa-images' own "
                "(not BuildKit's), signed, in cosign's tags"
            )
        if self.cache_from:
            lines.append(f"  cache      from {', '.join(self.cache_from)} (their inline build cache, where there)")
        return lines


def _notes(target: BuildTarget) -> str:
    said = (("built anew", target.anew), ("best effort", target.best_effort))
    notes = [note for note, holds in said if holds]
    return f" ({'; '.join(notes)})" if notes else ""


def runtime_build(entry: Entry) -> BuildTarget:
    """The one build: the legacy builder makes every stage on its way to the runtime image."""
    return BuildTarget(stage=contract.RUNTIME_STAGE, tag=entry.image, purpose="the image users pull")


def from_stages(entry: Entry, *, prebuilt: bool, form: BuilderForm, compiler_cache: bool) -> tuple[BuildTarget, ...]:
    """What the executor takes from the stages the build made: tagged, or their files read (the
    compiler cache only where the host keeps one); nothing for a generation that makes no wheel."""
    if not entry.recipe.makes_wheel:
        return ()
    wheel = BuildTarget(stage=contract.WHEEL_STAGE, tag=None, purpose="the wheel, exported and verified into dist")
    if prebuilt:
        return (wheel,)
    builder = BuildTarget(
        stage=contract.BUILDER_STAGE,
        tag=entry.builder_image,
        purpose="the compile's cache, tagged so `docker image prune` keeps it",
    )
    cache = BuildTarget(
        stage=contract.CACHE_STAGE,
        tag=None,
        purpose="the compiler cache, kept on the host for the next Python of the group",
        anew=form == "buildkit",  # read from the group's cache mount
        best_effort=True,
    )
    return (builder, wheel, cache) if compiler_cache else (builder, wheel)


def before_build(entry: Entry, *, prebuilt: bool, form: BuilderForm, compiler_cache: bool) -> tuple[BuildTarget, ...]:
    """Stages BuildKit's form builds first, each in a build of its own (the legacy form has neither
    a cache mount nor a mount of another stage):

    - torch-commit, from the build cache where it is there, where the compile mounts the torch venv:
      the torch stage and a step on it, which makes BuildKit commit it. BuildKit hashes a mount's
      files for the step's cache key and keeps the sum with the stage, but a sum taken before the
      stage is committed (by a step on it, or an image's export) is lost with the commit: the next
      entry on that torch would hash its 7 GB again (about 20 s on 16 cores). Its result is one
      empty file: the torch layer's export (another pass over the 7 GB) waits for the runtime
      image's, after the compile.
    - compiler-cache-in, anew, where the host keeps a compiler cache: the compile takes it from the
      group's cache mount, put there first so the compile step's cache key never depends on it.
    """
    if prebuilt or form != "buildkit" or not entry.recipe.makes_wheel:
        return ()
    torch = BuildTarget(
        stage=contract.TORCH_COMMIT_STAGE,
        tag=None,
        purpose="the torch stage, committed before the compile mounts its venv: hashed once, not for each entry",
    )
    fill = BuildTarget(
        stage=contract.CACHE_IN_STAGE,
        tag=None,
        purpose="the host's compiler cache of the group, into its cache mount",
        anew=True,
        best_effort=True,
    )
    return (() if entry.same_base else (torch,)) + ((fill,) if compiler_cache else ())


_GPU_NOTES = {
    "runtime": "  (GPUs from the engine's NVIDIA runtime; skipped without one, "
    f"on exit {contract.EXIT_NO_GPU}: no GPU seen, and on exit {contract.EXIT_WRONG_ARCH}: wrong arch)",
    "devices": "  (the host's /dev/nvidia* and driver libraries passed in; skipped on exit "
    f"{contract.EXIT_WRONG_ARCH}: wrong arch; any other failure fails)",
}


def checks(gpus: str) -> tuple[CheckCommand, ...]:
    """The checks for ``--gpus`` ``gpus``: with ``none`` the GPU check runs nothing (shown as skipped)."""
    import_check = CheckCommand(step="check", what="import check", command=contract.IMPORT_CHECK_COMMAND)
    if gpus == "none":
        return (import_check,)
    # Devices passed explicitly that torch cannot see are a failure, not a GPU-less host.
    no_gpu = contract.EXIT_NO_GPU if gpus == "runtime" else None
    gpu_check = CheckCommand(
        step="gpu-check", what="GPU check", command=contract.GPU_CHECK_COMMAND, gpus=gpus, no_gpu_exit=no_gpu
    )
    return (import_check, gpu_check)


def make_plan(
    entries: tuple[Entry, ...] | list[Entry],
    *,
    form: BuilderForm,
    compiler_cache: bool,
    check: bool = True,
    push: bool = False,
    gpus: str = "runtime",
    sign: bool = False,
    prebuilt: dict[str, Path] | None = None,
    published: dict[str, Wheel] | None = None,
    shared: dict[str, tuple[str, Path]] | None = None,
    python_from: str = "system",
) -> list[EntryPlan]:
    """``form``: the builder's (``BuilderDecision.form``); ``compiler_cache``: whether the host keeps
    each group's compiler cache (its way in and out is planned, or none is).
    ``prebuilt``: entry id -> a verified wheel to make that entry's image around; ``published``:
    entry id -> the wheel a published index serves for it, to the same end.
    ``shared``: entry id -> (the entry it is recorded for, the wheel in dist/) of its compile group's
    wheel, which an earlier run compiled for another entry (``current.shared_wheels``).
    ``python_from``: the matrix's ``bases.python``; uv makes the Python on the devel base."""
    prebuilt = prebuilt or {}
    published = {i: w for i, w in (published or {}).items() if i not in prebuilt}  # a file given first
    shared = {i: s for i, s in (shared or {}).items() if i not in prebuilt and i not in published}
    prebuilt = {**prebuilt, **{i: path for i, (_of, path) in shared.items()}}
    sharing = {i: of for i, (of, _path) in shared.items()}
    leaders = _group_leaders(entries, given=prebuilt.keys() - sharing.keys(), apart=published.keys() | sharing.keys())
    entries, sharing = _compiles_first(list(entries), {**sharing, **leaders})
    around = prebuilt.keys() | published.keys() | sharing.keys()
    skip: set[StepName] = set()
    if not check:
        skip |= {"check", "gpu-check"}
    if not push:
        skip.add("push")
    if not sign:
        skip.add("attest")
    steps = tuple(s for s in STEPS if s not in skip)

    def steps_of(e: Entry) -> tuple[StepName, ...]:
        """Attested: a wheel in dist/, a pushed image; a generation that makes no wheel and an
        image not pushed leave nothing to attest."""
        return steps if e.recipe.makes_wheel or "push" in steps else tuple(s for s in steps if s != "attest")

    def pushed(e: Entry) -> tuple[str, ...]:
        """BuildKit's images carry their build cache inline: the builder image, pushed beside the
        image, holds the compile's (the legacy builder's holds a 7 GB copy of torch and no cache)."""
        if "push" not in steps:
            return ()
        return (e.image, e.builder_image) if form == "buildkit" and e.id not in around else (e.image,)

    return [
        EntryPlan(
            entry=e,
            steps=steps_of(e),
            build=runtime_build(e),
            before=before_build(e, prebuilt=e.id in around, form=form, compiler_cache=compiler_cache),
            from_stages=from_stages(e, prebuilt=e.id in around, form=form, compiler_cache=compiler_cache),
            checks=tuple(c for c in checks(gpus) if c.step in steps),
            push=pushed(e),
            cache_from=pushed(e) if form == "buildkit" else (),
            # No compile, no devel base: unless uv makes the Python there.
            bases=tuple(
                dict.fromkeys(
                    [e.runtime_image]
                    if (e.id in around or not e.recipe.makes_wheel) and python_from != "uv"
                    else [e.devel_image, e.runtime_image]
                )
            ),
            prebuilt=prebuilt.get(e.id),
            published=published.get(e.id),
            shares_wheel_of=sharing.get(e.id),
            form=form,
        )
        for e in entries
    ]


def _group_leaders(entries: tuple[Entry, ...] | list[Entry], *, given: Set[str], apart: Set[str]) -> dict[str, str]:
    """Entry id -> the entry that puts its wheel into dist/, for the entries of a compile group that
    share one wheel (an abi3 wheel, on torch's stable ABI) other than that entry:
    the first one given the wheel (``--wheels``), else the one with the oldest torch, then Python,
    which compiles it, so the wheel asks the least of the torch it meets. ``apart``: entries whose
    wheel is already decided (published, or the group's in dist/)."""
    sharing = [e for e in entries if e.recipe.shares_wheel() and e.id not in apart]
    leaders = {}
    for members in groups.by_group(sharing).values():
        first = next((e for e in members if e.id in given), None) or groups.leader(members)
        leaders.update({e.id: first.id for e in members if e is not first})
    return leaders


def _compiles_first(entries: list[Entry], sharing: dict[str, str]) -> tuple[list[Entry], dict[str, str]]:
    """The entries in their order, each one whose wheel another entry of this run compiles moved
    after that entry."""
    ordered: list[Entry] = []
    placed: set[str] = set()
    waiting: dict[str, list[Entry]] = {}
    ids = {e.id for e in entries}
    for e in entries:
        leader = sharing.get(e.id)
        if leader in ids and leader not in placed:
            waiting.setdefault(leader, []).append(e)
            continue
        for one in (e, *waiting.pop(e.id, [])):
            ordered.append(one)
            placed.add(one.id)
    return ordered, sharing


def to_json(plans: list[EntryPlan]) -> str:
    return json.dumps([p.to_dict() for p in plans], indent=2)

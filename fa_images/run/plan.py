"""The plan: which steps run for which entry, computed before anything runs.

Each entry's plan names what the executor will do, and nothing it does is decided elsewhere:
the Dockerfile stages, the build targets in the order they are built and the tags they get,
the check commands run in the image, and the refs pushed. ``fa-images build --dry-run``
prints it (``--json`` serializes it). Entries that differ only in Python form a compile group
(``Entry.compile_group``, the ``group`` key): they run one after the other and share a compiler
cache, so the kernels compile once per group.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any, Literal, get_args

from ..builder import contract
from ..config.matrix import Entry

StepName = Literal["source", "build", "export", "check", "gpu-check", "push"]
# In order. "gpu-check" is reported as skipped when the engine has no GPU runtime.
STEPS: tuple[StepName, ...] = get_args(StepName)

# The stages of every rendered Dockerfile, in the order they appear.
STAGES = (contract.BUILDER_STAGE, contract.WHEEL_STAGE, contract.CACHE_STAGE, contract.RUNTIME_STAGE)


@dataclass(frozen=True, kw_only=True)
class BuildTarget:
    """One build of the entry's Dockerfile up to ``stage``, tagged ``tag`` (None: untagged)."""

    stage: str
    tag: str | None
    purpose: str

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "tag": self.tag, "purpose": self.purpose}


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
    targets: tuple[BuildTarget, ...]  # built in this order by the "build" step
    checks: tuple[CheckCommand, ...]  # one per check step that runs
    push: tuple[str, ...]  # the refs the "push" step pushes

    @property
    def stages(self) -> tuple[str, ...]:
        return STAGES

    @property
    def tags(self) -> tuple[str, ...]:
        return tuple(t.tag for t in self.targets if t.tag)

    def check(self, step: StepName) -> CheckCommand | None:
        """The command of check step ``step``; None where it runs none (the GPU check with --gpus none)."""
        return next((c for c in self.checks if c.step == step), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.entry.summary(),
            "steps": list(self.steps),
            "stages": list(self.stages),
            "targets": [t.to_dict() for t in self.targets],
            "tags": list(self.tags),
            "checks": [c.to_dict() for c in self.checks],
            "push": list(self.push),
        }

    def describe(self) -> list[str]:
        """The plan as a person reads it: one line per build, check and push."""
        lines = [f"{self.entry.id}: {' -> '.join(self.steps)}"]
        width = max(len(t.stage) for t in self.targets)
        for t in self.targets:
            lines.append(f"  build      --target {t.stage:<{width}}  {t.tag or '(untagged: ' + t.purpose + ')'}")
        for c in self.checks:
            note = _GPU_NOTES[c.gpus] if c.gpus else ""
            lines.append(f"  {c.step:<9}  {shlex.join(c.command)}{note}")
        if "gpu-check" in self.steps and self.check("gpu-check") is None:
            lines.append("  gpu-check  skipped: --gpus none")
        for ref in self.push:
            lines.append(f"  push       {ref}")
        return lines


def build_targets(entry: Entry) -> tuple[BuildTarget, ...]:
    """The runtime image first, with the live output; the other two reuse its cached layers."""
    return (
        BuildTarget(stage=contract.RUNTIME_STAGE, tag=entry.image, purpose="the image users pull"),
        BuildTarget(
            stage=contract.BUILDER_STAGE,
            tag=entry.builder_image,
            purpose="the compile's cache, tagged so `docker image prune` keeps it",
        ),
        BuildTarget(stage=contract.WHEEL_STAGE, tag=None, purpose="the wheel alone, exported and verified into dist"),
        BuildTarget(
            stage=contract.CACHE_STAGE,
            tag=None,
            purpose="the compiler cache, kept on the host for the next Python of the group",
        ),
    )


_GPU_NOTES = {
    "runtime": "  (GPUs from the engine's NVIDIA runtime; skipped without one, "
    f"and on exit {contract.EXIT_NO_GPU}: no GPU seen)",
    "devices": "  (the host's /dev/nvidia* and driver libraries passed in; any failure fails)",
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
    entries: tuple[Entry, ...], *, check: bool = True, push: bool = False, gpus: str = "runtime"
) -> list[EntryPlan]:
    skip: set[StepName] = set()
    if not check:
        skip |= {"check", "gpu-check"}
    if not push:
        skip.add("push")
    steps = tuple(s for s in STEPS if s not in skip)
    return [
        EntryPlan(
            entry=e,
            steps=steps,
            targets=build_targets(e),
            checks=tuple(c for c in checks(gpus) if c.step in steps),
            push=(e.image,) if "push" in steps else (),
        )
        for e in entries
    ]


def to_json(plans: list[EntryPlan]) -> str:
    return json.dumps([p.to_dict() for p in plans], indent=2)

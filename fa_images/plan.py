"""The plan: which steps run for which entry, computed before anything runs.

It can be printed (``fa-images build --dry-run``) or serialized (``--json``). Grouping
entries that can share one compile (same flash-attn, torch, CUDA and archs, different
Python) belongs here too, as a plan transformation, when the executor learns to reuse it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .matrix import Entry

# In order. "gpu-check" is reported as skipped when the engine has no GPU runtime.
STEPS = ("source", "build", "export", "check", "gpu-check", "push")


@dataclass(frozen=True)
class EntryPlan:
    entry: Entry
    steps: tuple[str, ...]

    def to_dict(self) -> dict:
        return {**self.entry.summary(), "steps": list(self.steps)}


def make_plan(entries: tuple[Entry, ...], *, check: bool = True, push: bool = False) -> list[EntryPlan]:
    skip = set()
    if not check:
        skip |= {"check", "gpu-check"}
    if not push:
        skip.add("push")
    return [EntryPlan(entry=e, steps=tuple(s for s in STEPS if s not in skip)) for e in entries]


def to_json(plans: list[EntryPlan]) -> str:
    return json.dumps([p.to_dict() for p in plans], indent=2)

"""Where a wheel build's time goes: its phases, each marked when it ends.

A phase lasts from the mark before it to its own. Marks use the wall clock (``time.time()``), not a
monotonic one, because the setup.py shim marks phases in a child process and the builder puts
those marks into the same timeline (``contract.phase_mark_line``). The compile itself is the phase
``contract.COMPILE_PHASE``; everything else is the time a build spends outside ninja.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .contract import phases_line


@dataclass
class Timeline:
    started: float = field(default_factory=time.time)
    marks: list[tuple[str, float]] = field(default_factory=list)

    def mark(self, name: str, at: float | None = None) -> None:
        """Phase ``name`` ended now (or at ``at``, a time.time() from another process)."""
        self.marks.append((name, time.time() if at is None else at))

    def phases(self) -> list[tuple[str, float]]:
        """(name, seconds) in the order they ran; a name marked twice is summed at its first place."""
        seconds: dict[str, float] = {}
        last = self.started
        for name, at in sorted(self.marks, key=lambda mark: mark[1]):  # stable: equal times keep their order
            seconds[name] = seconds.get(name, 0.0) + max(0.0, at - last)
            last = max(last, at)
        return list(seconds.items())

    def line(self) -> str:
        return phases_line(self.phases())

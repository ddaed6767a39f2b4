"""CPU priority in the test run: the engine tier's shared story sets the run's length
(bench/test_suite.md), so every other test runs at a lower priority, as do the daemons, commands
and threads it starts (Podman's engine, bake's, compiles, the unit tier), and takes the CPU time
the story leaves. The story's own engine is started by its worker at the normal priority."""

from __future__ import annotations

import os

STORY = 0
BESIDE_THE_STORY = 10


def set_niceness(value: int) -> None:
    """This thread's niceness, which the processes and threads it starts inherit. Raising the
    priority again needs root; without root there is no engine tier to make way for."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, value)
    except PermissionError:
        pass


def beside_the_story() -> None:
    set_niceness(BESIDE_THE_STORY)

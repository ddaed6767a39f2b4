"""How pytest-xdist hands the suite's groups to its workers (the hook is in tests/conftest.py)."""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadGroupScheduling

# The group of the engine tier's modules: they share one engine, so one worker runs them in order.
ENGINE_GROUP = "engine"


class EngineGroupAlone(LoadGroupScheduling):
    """pytest-xdist's scheduling by group, except that a worker running the engine group gets no
    other group while two or more of that group's tests are left.

    pytest-xdist hands a worker its next group when two or fewer of its tests are left; the engine
    group's last long ones are the torch release loop and the new runner, about ten minutes, and a
    group handed to that worker then waited behind them while the other worker ran out of work.
    With one test left the worker must be handed something: it runs a test only once it holds the
    next one (or is told to stop). So the group ends on a check of a second
    (tests/engine/test_engine_left_clean.py): the new runner runs while the worker holds it, and
    the next group, or the stop, comes when the runner is done."""

    def _reschedule(self, node: Any) -> None:
        engine = self.assigned_work.get(node, {}).get(ENGINE_GROUP, {})
        if self.workqueue and sum(not done for done in engine.values()) > 1:
            return
        super()._reschedule(node)

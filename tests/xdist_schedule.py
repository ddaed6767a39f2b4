"""How pytest-xdist hands the suite's groups to its workers (the hook is in tests/conftest.py)."""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadGroupScheduling

# The group of the engine tier's modules: they share one engine, so one worker runs them in order.
ENGINE_GROUP = "engine"


class EngineGroupAlone(LoadGroupScheduling):
    """pytest-xdist's scheduling by group, except that a worker running the engine group gets no
    other group while any of that group's tests is left. pytest-xdist hands a worker its next group
    when two or fewer of its tests are left; the engine group's last two are the torch release loop
    and the new runner, about ten minutes, and a group handed to that worker then waited behind
    them while the other worker ran out of work."""

    def _reschedule(self, node: Any) -> None:
        engine = self.assigned_work.get(node, {}).get(ENGINE_GROUP, {})
        if self.workqueue and not all(engine.values()):
            return
        super()._reschedule(node)

"""The suite's scheduler (tests/xdist_schedule.py) on pytest-xdist's own scheduling by group: the
engine group's worker is handed no other group while two of that group's tests are left; every
other worker as pytest-xdist hands it work. The engine group ends as the suite's does: the loop, the
new runner, and a check of a second."""

from __future__ import annotations

from types import SimpleNamespace

from xdist.scheduler import LoadGroupScheduling
from xdist_schedule import ENGINE_GROUP, EngineGroupAlone

# The engine group's five tests on one worker; four groups of one test each, for either worker.
ENGINE = [f"tests/engine/test_{n}.py::t@{ENGINE_GROUP}" for n in ("a", "b", "loop", "runner", "clean")]
A, B, LOOP, RUNNER, CLEAN = ENGINE
W, X, Y, Z = OTHERS = [f"tests/unit/test_{n}.py::t" for n in ("w", "x", "y", "z")]
COLLECTION = [*ENGINE, *OTHERS]


class Node:
    """What a scheduler asks of a worker (xdist.workermanage.WorkerController): its name, its tests
    by their index in the collection, and a shutdown when there is nothing left. Its tests finish as
    the real worker's do (xdist.remote.WorkerInteractor.run_one_test): a test runs only once the
    worker holds the next one, or has been told to shut down."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[str] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(COLLECTION[i] for i in indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def _scheduler(kind: type[LoadGroupScheduling]) -> tuple[LoadGroupScheduling, Node, Node]:
    options = {"tx": ["2*popen"]}  # two workers, as pytest.ini_options has it
    config = SimpleNamespace(option=SimpleNamespace(loadscopereorder=False), getvalue=options.__getitem__)
    sched = kind(config)
    story, other = Node("gw0"), Node("gw1")
    for node in (story, other):
        sched.add_node(node)
        sched.add_node_collection(node, COLLECTION)
    sched.schedule()
    return sched, story, other


def _finish(sched: LoadGroupScheduling, node: Node, nodeid: str) -> None:
    held = node.sent[node.sent.index(nodeid) + 1 :]
    assert held or node.shutting_down, f"{node.gateway.id} waits for a test to follow {nodeid}"
    sched.mark_test_complete(node, COLLECTION.index(nodeid))


def test_the_engine_groups_worker_takes_no_other_group_while_two_of_its_tests_are_left() -> None:
    sched, story, other = _scheduler(EngineGroupAlone)
    assert story.sent == ENGINE and other.sent == [W, X]  # the other starts with two
    for nodeid in (A, B, LOOP):  # down to the runner and the check, where pytest-xdist's own hands it a group
        _finish(sched, story, nodeid)
    assert story.sent == ENGINE
    _finish(sched, other, W)
    assert other.sent == [W, X, Y]  # the other worker takes the groups meanwhile
    _finish(sched, story, RUNNER)  # it held the check: the runner ran at once
    assert story.sent == [*ENGINE, Z]  # the check alone left: the next group follows it


def test_the_last_group_goes_to_the_worker_that_is_free_first() -> None:
    """A group left when the loop ends is the other worker's as soon as it is free, not queued behind
    the new runner."""
    sched, story, other = _scheduler(EngineGroupAlone)
    _finish(sched, other, W)
    for nodeid in (A, B, LOOP):
        _finish(sched, story, nodeid)
    assert sched.workqueue and story.sent == ENGINE
    _finish(sched, other, X)
    assert other.sent == [W, X, Y, Z] and not sched.workqueue
    _finish(sched, story, RUNNER)
    assert story.shutting_down and story.sent == ENGINE


def test_with_the_queue_empty_the_engine_groups_worker_is_told_to_stop() -> None:
    """Its last test then runs: nothing else would ever follow it."""
    sched, story, other = _scheduler(EngineGroupAlone)
    for nodeid in (W, X):
        _finish(sched, other, nodeid)
    assert other.sent == [W, X, Y, Z] and not sched.workqueue
    for nodeid in ENGINE:
        _finish(sched, story, nodeid)
    assert story.shutting_down and story.sent == ENGINE


def test_pytest_xdists_own_scheduling_queues_a_group_behind_the_loop() -> None:
    """What the suite's scheduler changes: the same steps on pytest-xdist's own."""
    sched, story, _ = _scheduler(LoadGroupScheduling)
    for nodeid in (A, B, LOOP):
        _finish(sched, story, nodeid)
    assert story.sent == [*ENGINE, Y]

"""When the engine group's last test starts, on a real pytest-xdist run of a toy suite.

    python bench/engine_worker_last_test.py [--scheduler suite|xdist] [--no-check] [--loop SECONDS]

The toy suite has the shape of the real one: an engine group of four tests on one worker (the
second and third stand for the torch release loop and the new runner, the last for the check of
what the tier left, tests/engine/test_engine_left_clean.py; `--no-check` leaves it out) and six
groups of one test each, which take longer than the loop (1 s unless `--loop` says). It runs with
two workers, as `.ci/run` does, under the suite's scheduler (tests/xdist_schedule.py) or
pytest-xdist's own, and prints when each test began, in seconds from the first. A pytest-xdist
worker runs a test only once it holds the next one (or is told to stop), so a scheduler that hands
the engine group's worker nothing after the loop leaves the runner waiting for the end of the run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"

CONFTEST = """
import sys
import pytest
sys.path.insert(0, {tests!r})
import xdist_schedule
from xdist.scheduler import LoadGroupScheduling

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    for item in items:
        engine = item.path.parent.name == "engine"
        item.add_marker(pytest.mark.xdist_group("engine" if engine else item.nodeid.split("::")[0]))
    items.sort(key=lambda item: item.path.parent.name != "engine")

def pytest_xdist_make_scheduler(config, log):
    suite = {scheduler!r} == "suite"
    return xdist_schedule.EngineGroupAlone(config, log) if suite else LoadGroupScheduling(config, log)
"""

MARK = """
import os, time
def mark(what):
    with open(os.environ["BENCH_MARKS"], "a") as out:
        out.write(f"{what} {time.time()}\\n")
"""

STORY = """
import time
from marks import mark
def test_a(): mark("a"); time.sleep(0.2)
def test_loop(): mark("loop"); time.sleep({loop})
def test_runner(): mark("runner"); time.sleep(1)
"""

CHECK = """
def test_clean(): mark("check")
"""

OTHER = """
import time
from marks import mark
def test_x(): mark("other{n}"); time.sleep(1.5)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scheduler", choices=("suite", "xdist"), default="suite")
    parser.add_argument("--no-check", action="store_true", help="end the engine group on the runner")
    parser.add_argument("--loop", type=float, default=1.0, help="seconds of the loop (default 1)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "tests" / "engine").mkdir(parents=True)
        (root / "tests" / "other").mkdir()
        (root / "tests" / "conftest.py").write_text(CONFTEST.format(tests=str(TESTS), scheduler=args.scheduler))
        (root / "marks.py").write_text(MARK)
        story = STORY.format(loop=args.loop) + ("" if args.no_check else CHECK)
        (root / "tests" / "engine" / "test_story.py").write_text(story)
        for n in range(1, 7):
            (root / "tests" / "other" / f"test_other{n}.py").write_text(OTHER.format(n=n))
        marks = root / "marks.log"
        env = {**os.environ, "BENCH_MARKS": str(marks), "PYTHONPATH": str(root)}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup"]
        proc = subprocess.run(
            [*cmd, "--no-loadscope-reorder", "tests"], cwd=root, env=env, capture_output=True, text=True
        )
        if proc.returncode != 0:
            print(proc.stdout[-2000:] + proc.stderr[-2000:], file=sys.stderr)
            return proc.returncode
        began = sorted((float(t), what) for what, t in (line.split() for line in marks.read_text().splitlines()))
        zero = began[0][0]
        print(f"{args.scheduler}: " + ", ".join(f"{what} {t - zero:.1f} s" for t, what in began))
        print(proc.stdout.strip().splitlines()[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())

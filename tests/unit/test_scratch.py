"""Scratch directories: removed on every way out, and reaped after a kill by the next run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fa_images.builder import scratch

REPO = Path(__file__).resolve().parents[2]


def _child(parent: Path, body: str) -> subprocess.Popen[str]:
    """A process that opens a scratch dir under ``parent``, says where, then runs ``body`` inside it."""
    code = "\n".join(
        [
            "import signal, time",
            "from pathlib import Path",
            "from fa_images.builder import scratch",
            "from fa_images.builder.cli import _terminate",
            "signal.signal(signal.SIGTERM, _terminate)  # as run_command installs it",
            # A suite started in the background hands its children an ignored SIGINT; a shell does not.
            "signal.signal(signal.SIGINT, signal.default_int_handler)",
            f"with scratch.scratch_dir('test', parent=Path({str(parent)!r})) as path:",
            "    print(path, flush=True)",
            f"    {body}",
        ]
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)


@pytest.mark.parametrize(
    ("body", "signum"),
    [
        ("time.sleep(1)", None),
        ("time.sleep(1); raise RuntimeError('boom')", None),
        ("time.sleep(60)", signal.SIGINT),
        ("time.sleep(60)", signal.SIGTERM),
    ],
    ids=["success", "failure", "ctrl-c", "sigterm"],
)
def test_removed_on_every_way_out(tmp_path: Path, body: str, signum: int | None) -> None:
    proc = _child(tmp_path, body)
    assert proc.stdout is not None
    path = Path(proc.stdout.readline().strip())
    assert path.is_dir() and path.parent == tmp_path
    if signum is not None:
        time.sleep(0.2)
        proc.send_signal(signum)
    proc.wait(timeout=30)
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []


def test_a_killed_owner_is_reaped_by_the_next_run(tmp_path: Path) -> None:
    proc = _child(tmp_path, "time.sleep(60)")
    assert proc.stdout is not None
    left = Path(proc.stdout.readline().strip())
    proc.send_signal(signal.SIGKILL)  # no finally runs
    proc.wait(timeout=30)
    assert left.is_dir()
    with scratch.scratch_dir("next", parent=tmp_path) as mine:
        assert not left.exists()
        assert list(tmp_path.iterdir()) == [mine]


def test_a_live_owner_and_foreign_dirs_are_left_alone(tmp_path: Path) -> None:
    proc = _child(tmp_path, "time.sleep(60)")
    assert proc.stdout is not None
    live = Path(proc.stdout.readline().strip())
    foreign = tmp_path / "fa-images-not-ours"
    foreign.mkdir()  # no owner file: not made by scratch_dir, never touched
    try:
        assert scratch.reap(tmp_path) == []
        assert live.is_dir() and foreign.is_dir()
    finally:
        proc.kill()
        proc.wait()


def test_keep_leaves_it_and_says_where(tmp_path: Path) -> None:
    said: list[str] = []
    with scratch.scratch_dir("kept", parent=tmp_path, keep=True, log=said.append) as path:
        pass
    assert path.is_dir()
    assert said == [f"kept the work dir for debugging: {path}"]
    assert scratch.reap(tmp_path) == []  # kept on purpose: never reaped

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


# --- what the reaper finds in a shared temp dir: anyone's, so read as untrusted -------------

DEAD = f"{os.getpid()} 1\n"  # a pid whose start time does not match: its owner is gone


def _stale(parent: Path, name: str, owner: str = DEAD) -> Path:
    path = parent / f"{scratch.PREFIX}{name}"
    path.mkdir(mode=0o700)
    (path / scratch.OWNER_FILE).write_text(owner)
    return path


def _fifo_owner(d: Path, outside: Path) -> None:
    os.mkfifo(d / scratch.OWNER_FILE)  # a read would wait for a writer forever


def _linked_owner(d: Path, outside: Path) -> None:
    (outside / "owner").write_text(DEAD)  # followed, it would say "dead": reap
    os.symlink(outside / "owner", d / scratch.OWNER_FILE)


def _dev_zero_owner(d: Path, outside: Path) -> None:
    os.symlink("/dev/zero", d / scratch.OWNER_FILE)


def _huge_owner(d: Path, outside: Path) -> None:
    with (d / scratch.OWNER_FILE).open("w") as f:
        f.write(DEAD)
        f.truncate(1 << 30)  # sparse: 1 GiB that a read without a cap would pull into memory


def _dir_owner(d: Path, outside: Path) -> None:
    os.mkdir(d / scratch.OWNER_FILE)


def _other_uid(d: Path, outside: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to give a directory to another uid")
    os.chown(d, 65534, 65534)


def _group_writable(d: Path, outside: Path) -> None:
    os.chmod(d, 0o770)


def _world_writable(d: Path, outside: Path) -> None:
    os.chmod(d, 0o777)


def _garbage(content: bytes):
    def make(d: Path, outside: Path) -> None:
        (d / scratch.OWNER_FILE).write_bytes(content)

    return make


@pytest.mark.parametrize(
    "make",
    [
        _fifo_owner,
        _linked_owner,
        _dev_zero_owner,
        _huge_owner,
        _dir_owner,
        _other_uid,
        _group_writable,
        _world_writable,
        _garbage(b"\xff\xfe\x00garbage"),
        _garbage(b"0 1\n"),  # pid 0 would signal the process group
        _garbage(b"-1 1\n"),
        _garbage(b"99999999999 1\n"),
        _garbage(b"12 1 extra\n"),
        _garbage(b""),
    ],
    ids=[
        "fifo-owner",
        "symlinked-owner",
        "dev-zero-owner",
        "huge-owner",
        "owner-is-a-dir",
        "other-uid",
        "group-writable",
        "world-writable",
        "binary-garbage",
        "pid-0",
        "negative-pid",
        "huge-pid",
        "three-fields",
        "empty",
    ],
)
def test_a_dir_that_is_not_ours_is_left_alone_and_the_run_goes_on(tmp_path: Path, make) -> None:
    root, outside = tmp_path / "tmp", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    hostile = _stale(root, "hostile")
    (hostile / scratch.OWNER_FILE).unlink()
    (hostile / "keep").write_text("not the tool's")
    make(hostile, outside)
    stale = _stale(root, "stale")  # a real leftover beside it: still reaped
    before = sorted(p.name for p in outside.iterdir())

    def hung(*_: object) -> None:
        raise TimeoutError("reap hung")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)  # a hang guard, not a speed test: a reap that loops never ends
    try:
        removed = scratch.reap(root)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert removed == [stale]
    assert (hostile / "keep").read_text() == "not the tool's"
    assert sorted(p.name for p in outside.iterdir()) == before


def test_a_symlinked_dir_is_never_followed(tmp_path: Path) -> None:
    root = tmp_path / "tmp"
    root.mkdir()
    target = _stale(tmp_path, "elsewhere")  # a dead-owner dir outside the temp dir
    (target / "precious").write_text("x")
    link = root / f"{scratch.PREFIX}link"
    link.symlink_to(target, target_is_directory=True)
    assert scratch.reap(root) == []
    assert link.is_symlink() and (target / "precious").read_text() == "x"


def test_a_file_under_the_prefix_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / f"{scratch.PREFIX}file").write_text(DEAD)
    os.mkfifo(tmp_path / f"{scratch.PREFIX}fifo")
    assert scratch.reap(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{scratch.PREFIX}fifo", f"{scratch.PREFIX}file"]


def test_removal_of_a_stale_dir_follows_no_link_inside(tmp_path: Path) -> None:
    root, outside = tmp_path / "tmp", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "precious").write_text("x")
    stale = _stale(root, "stale")
    (stale / "to-outside").symlink_to(outside, target_is_directory=True)
    (stale / "file-link").symlink_to(outside / "precious")
    assert scratch.reap(root) == [stale]
    assert not stale.exists() and (outside / "precious").read_text() == "x"


def test_a_fixed_name_run_is_not_blocked_by_a_hostile_neighbour(tmp_path: Path) -> None:
    hostile = tmp_path / f"{scratch.PREFIX}hostile"
    hostile.mkdir(mode=0o700)
    os.mkfifo(hostile / scratch.OWNER_FILE)
    with scratch.scratch_dir("fixed", parent=tmp_path, fixed_name=True) as path:
        assert path.is_dir()
    assert hostile.is_dir()

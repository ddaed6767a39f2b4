"""Scratch directories: the only places fa-images ever deletes from.

Every temporary directory the tool needs (a wheel build's work dir, an image's build
context) is made fresh here, owned by this process, and removed on every way out:
success, an error, Ctrl-C or SIGTERM (``run_command`` turns SIGTERM into ``SystemExit``
so ``finally`` blocks run). A SIGKILL cannot be caught, so each directory records its
owner's pid and start time, and the next run removes those whose owner is gone.

Nothing outside a directory made here is ever removed, whatever names an sdist holds.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import UsageError

PREFIX = "fa-images-"
OWNER_FILE = ".fa-images-owner"


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (tells a live owner from a reused pid), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22; the command name (field 2) may hold spaces, so count from its closing ')'.
    return stat.rsplit(")", 1)[1].split()[19]


def _owner_alive(directory: Path) -> bool:
    try:
        pid_text, started = (directory / OWNER_FILE).read_text().split()
        pid = int(pid_text)
    except (OSError, ValueError):
        return True  # not made by this module (or being made right now): never touch it
    if not Path("/proc").is_dir():  # no procfs: fall back to "does the pid exist"
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return _start_time(pid) == started


def reap(root: Path | None = None) -> list[Path]:
    """Removes the scratch directories under ``root`` whose owning process has died."""
    root = Path(root or tempfile.gettempdir())
    removed: list[Path] = []
    try:
        candidates = [p for p in root.iterdir() if p.name.startswith(PREFIX) and p.is_dir() and not p.is_symlink()]
    except OSError:
        return removed
    for path in candidates:
        if not _owner_alive(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


@contextmanager
def scratch_dir(
    kind: str,
    *,
    parent: Path | None = None,
    keep: bool = False,
    fixed_name: bool = False,
    keep_on_success: bool = False,
    log: Callable[[str], None] = lambda _: None,
) -> Iterator[Path]:
    """A new, empty directory ``<parent>/fa-images-<kind>-XXXX``, removed when the block ends.

    ``fixed_name`` makes it ``<parent>/fa-images-<kind>``, for a build whose paths must be the
    same every time (a compiler cache keys on them); a live run holding that name is an error.
    ``keep`` leaves it in place for debugging and says where it is; ``keep_on_success`` only when
    the block ends without an exception (what it made is the command's output).
    """
    parent = Path(parent or tempfile.gettempdir())
    reap(parent)
    if fixed_name:
        path = parent / f"{PREFIX}{kind}"
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            raise UsageError(
                f"{path} exists: another build is using it, or it was kept with --keep-work",
                hint="wait for that build, remove the kept directory, or pass another --work-dir",
            ) from None
    else:
        path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-", dir=parent))
    (path / OWNER_FILE).write_text(f"{os.getpid()} {_start_time(os.getpid()) or 0}\n")
    succeeded = False
    try:
        yield path
        succeeded = True
    finally:
        if keep or (keep_on_success and succeeded):
            (path / OWNER_FILE).unlink(missing_ok=True)  # kept on purpose: no later run reaps it
            log(f"kept the work dir for debugging: {path}")
        else:
            shutil.rmtree(path, ignore_errors=True)

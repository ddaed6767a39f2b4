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
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from . import safe_io, untrusted
from .errors import UsageError

PREFIX = "fa-images-"
OWNER_FILE = ".fa-images-owner"


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (tells a live owner from a reused pid), or None."""
    try:
        line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22; the command name (field 2) may hold spaces, so count from its closing ')'.
    return line.rsplit(")", 1)[1].split()[19]


# "<pid> <start time>\n": a few dozen bytes. A shared temp dir is writable by every local user,
# so whatever is found there is read as untrusted: no link followed, no FIFO waited on, capped.
_MAX_OWNER = 64
_MAX_PID = 1 << 22  # the kernel's PID_MAX_LIMIT; 0 or a negative pid would signal a group
_OWNER_LINE = re.compile(r"([0-9]{1,7}) ([0-9]{1,20})\n?", re.ASCII)


def _is_ours(info: os.stat_result) -> bool:
    """A directory of this user that no one else can write: what scratch_dir makes (0700)."""
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o022


def _owner(root_fd: int, name: str) -> tuple[int, str] | None:
    """(pid, start time) recorded in ``root/name``, or None where that is not a directory this
    module made: not ours, a link, open to others, an owner file that is missing, a link, not a
    regular file, too large or malformed. None means: leave it alone."""
    try:
        info = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
        if not _is_ours(info):
            return None
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), dir_fd=root_fd)
    except OSError:
        return None
    try:
        here = os.fstat(fd)
        if (here.st_dev, here.st_ino) != (info.st_dev, info.st_ino) or not _is_ours(here):
            return None  # swapped between the look and the open
        raw = untrusted.read_file(OWNER_FILE, limit=_MAX_OWNER, what="owner file", dir_fd=fd, follow_symlinks=False)
    except (OSError, untrusted.UntrustedInput):
        return None
    finally:
        os.close(fd)
    match = _OWNER_LINE.fullmatch(raw.decode("ascii", "replace"))
    if not match or not 0 < int(match.group(1)) < _MAX_PID:
        return None
    return int(match.group(1)), match.group(2)


def _alive(pid: int, started: str) -> bool:
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
    """Removes the scratch directories under ``root`` whose owning process has died.

    Only a directory that is this user's own, open to no one else, with a well-formed owner
    file naming a dead process is removed, and its removal follows no link inside it
    (``safe_io``). Anything else under the prefix is left alone, silently: it is not ours."""
    # The temp dir itself is the user's choice (TMPDIR may be a link they made); below it, nothing is followed.
    root = Path(os.path.realpath(root or tempfile.gettempdir()))
    removed: list[Path] = []
    try:
        out = safe_io.OutputDir(root, create=False, what="temp directory")
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    except (OSError, safe_io.UnsafeOutput):
        return removed
    try:
        names = sorted(n for n in os.listdir(root_fd) if n.startswith(PREFIX))
        for name in names:
            owner = _owner(root_fd, name)
            if owner is None or _alive(*owner):
                continue
            try:
                out.remove_tree(name)
            except (OSError, safe_io.UnsafeOutput):
                continue  # half gone, or swapped for a link meanwhile: the next run tries again
            removed.append(root / name)
    except OSError:
        pass
    finally:
        os.close(root_fd)
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

"""The host's compiler caches, one per compile group (``Entry.compile_group``).

Entries that differ only in Python compile the same kernels: none includes Python.h. Each build
context carries its group's cache (``contract.CACHE_CONTEXT_DIR``), the builder stage compiles
through it, and the cache it leaves, with this compile's objects added, then replaces the host's
copy. The next Python of the group, in this run or a later one, compiles only what differs.

A cache is an accelerator, never an input: it is not part of an entry's inputs digest, and a
missing or unusable one costs a full compile and nothing else.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..builder import contract


def default_root(cache_home: Path) -> Path:
    return cache_home / "compiler-cache"


def size_of(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def fill(root: Path | None, group: str, dest: Path) -> int:
    """Puts the group's cache into ``dest`` (made here, empty without one); returns its bytes.
    Hard links where the file system allows: the context is read, never written."""
    dest.mkdir()
    kept = root / group if root is not None else None
    if kept is None or not kept.is_dir():
        return 0
    shutil.copytree(kept, dest, dirs_exist_ok=True, copy_function=_link_or_copy)
    return size_of(dest)


def incoming(root: Path, group: str) -> Path:
    """A new, empty directory beside the group's cache (on its file system, so ``install`` renames):
    the build writes the cache stage's files into it."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / f".{group}.{os.getpid()}.in"
    shutil.rmtree(path, ignore_errors=True)  # left by an earlier run of this pid, stopped
    path.mkdir()
    return path


def install(arrived: Path, root: Path, group: str) -> int:
    """Replaces the group's cache with the one the cache stage left in ``arrived`` (from
    ``incoming``, removed here); returns its bytes. Renamed into place, the old one aside first, so
    an interrupted save keeps the old."""
    final, old = root / group, root / f".{group}.{os.getpid()}.old"
    new = arrived / contract.CACHE_EXPORT_DIR.lstrip("/")
    try:
        if not new.is_dir() or new.is_symlink():
            raise OSError(f"the cache stage holds no {contract.CACHE_EXPORT_DIR}")
        size = size_of(new)
        if final.exists():
            final.rename(old)
        new.rename(final)
        return size
    finally:
        if old.exists() and not final.exists():  # stopped between the two renames
            old.rename(final)
        for leftover in (arrived, old):
            shutil.rmtree(leftover, ignore_errors=True)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links refused
        shutil.copy2(src, dst)

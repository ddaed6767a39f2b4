"""The one way fa-images writes and deletes files: inside a checked directory, never through a link.

An output directory (``dist/``, ``dockerfiles/``, a bake dir, a workflow's folder) may hold
what others put there: a committed ``dockerfiles/`` can carry a symlink named like a file
fa-images writes, or a ``simple/`` that points at ``$HOME``. So:

- the directory named on the command line must be a directory and not itself a symlink;
- below it every component is opened with O_NOFOLLOW relative to its parent's descriptor,
  so a symlink anywhere under it is an error, never followed;
- a file is written to a temporary name in the same directory and renamed over the old one
  (readers never see half a file), and never over a directory or a symlink;
- a writer of several files checks them all first (``check_writable``), so a refusal comes
  before anything changed, and names what is really in the way (a symlink, a FIFO, a file);
- a writer of several files can undo its change: ``read_bytes`` keeps what it replaces, and
  ``link_in`` leaves a moved file's source in place until the caller removes it;
- only what fa-images wrote is removed: the caller names the files it owns, and a directory
  goes only when nothing else is left in it.

Anything refused is an ``UnsafeOutput``, a UsageError: one ``error:`` line, exit 2.
Stdlib only, Python 3.9: it travels into images with the builder.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import TextIO, Union

from .errors import UsageError
from .untrusted import UntrustedInput, kind_of, open_regular, read_file

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
Rel = Union[str, PurePosixPath]


class UnsafeOutput(UsageError):
    """An output path fa-images refuses to write or delete (exit 2)."""


def _parts(rel: Rel) -> list[str]:
    parts = [p for p in PurePosixPath(rel).parts if p not in ("", ".")]
    if not parts or any(p in ("..", "/") or "/" in p or "\0" in p for p in parts):
        raise UnsafeOutput(f"{rel!s} is not a plain relative path below the output directory")
    return parts


class OutputDir:
    """A directory fa-images writes into, checked once; every path under it is relative."""

    def __init__(self, path: Path, *, create: bool = True, what: str = "output directory") -> None:
        self.path = Path(path)
        self.what = what
        try:
            info = os.lstat(self.path)
        except FileNotFoundError:
            if not create:
                raise UnsafeOutput(f"{what} {self.path} does not exist") from None
            try:
                os.makedirs(self.path, exist_ok=True)
            except OSError as exc:
                raise UnsafeOutput(f"{what} {self.path} cannot be a directory: {exc.strerror}") from None
            info = os.lstat(self.path)
        except OSError as exc:
            raise UnsafeOutput(f"{what} {self.path} cannot be a directory: {exc.strerror}") from None
        if stat.S_ISLNK(info.st_mode):
            raise UnsafeOutput(
                f"{what} {self.path} is a symlink; fa-images does not write through links it did not make "
                f"(give the real directory: {os.path.realpath(self.path)})"
            )
        if not stat.S_ISDIR(info.st_mode):
            raise UnsafeOutput(f"{what} {self.path} cannot be a directory: it is {kind_of(info.st_mode)}")

    def _shown(self, parts: list[str]) -> str:
        return str(self.path.joinpath(*parts))

    @contextlib.contextmanager
    def _dir_fd(self, parts: list[str], *, create: bool) -> Iterator[int]:
        """A descriptor of ``self.path/parts...``, each component opened without following a link."""
        fd = os.open(self.path, _DIR_FLAGS)
        try:
            for i, name in enumerate(parts):
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(name, 0o755, dir_fd=fd)
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    raise self._refusal(parts[: i + 1], exc, fd) from None
                os.close(fd)
                fd = child
            yield fd
        finally:
            os.close(fd)

    def _refusal(self, parts: list[str], exc: OSError, parent_fd: int) -> UnsafeOutput:
        shown = self._shown(parts)
        if exc.errno in (errno.ELOOP, errno.EMLINK):
            return UnsafeOutput(f"{shown} is a symlink; fa-images does not write through links it did not make")
        if exc.errno == errno.ENOTDIR:
            return UnsafeOutput(f"{shown} must be a directory, but it is {_what_is(parent_fd, parts[-1])}")
        return UnsafeOutput(f"{shown} cannot be used: {exc.strerror}")

    def check_writable(self, files: Iterable[Rel]) -> None:
        """Refuses, before anything is written, every path of ``files`` that a write would
        refuse later: a parent that is not a directory (a symlink, a file, a FIFO...) or a
        target that is neither absent nor a regular file. Nothing is created or followed, so
        a writer that checks all its outputs first changes all of them or none."""
        for rel in files:
            parts = _parts(rel)
            fd = os.open(self.path, _DIR_FLAGS)
            try:
                for i, name in enumerate(parts):
                    try:
                        mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
                    except FileNotFoundError:
                        break  # made when written: nothing below it can be in the way
                    last = i == len(parts) - 1
                    if last and not stat.S_ISREG(mode):
                        shown = self._shown(parts)
                        raise UnsafeOutput(f"{shown} must be a file, but it is {kind_of(mode)}; nothing was written")
                    if not last:
                        if not stat.S_ISDIR(mode):
                            shown = self._shown(parts[: i + 1])
                            raise UnsafeOutput(
                                f"{shown} must be a directory, but it is {kind_of(mode)}; nothing was written"
                            )
                        child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                        os.close(fd)
                        fd = child
            finally:
                os.close(fd)

    def kind(self, rel: Rel) -> str | None:
        """'file', 'dir', 'link', 'other', or None when nothing is there (a link is not followed)."""
        parts = _parts(rel)
        try:
            with self._dir_fd(parts[:-1], create=False) as fd:
                mode = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False).st_mode
        except (FileNotFoundError, UnsafeOutput):
            return None
        if stat.S_ISLNK(mode):
            return "link"
        return "file" if stat.S_ISREG(mode) else "dir" if stat.S_ISDIR(mode) else "other"

    def mkdir(self, rel: Rel) -> Path:
        parts = _parts(rel)
        with self._dir_fd(parts, create=True):
            pass
        return self.path.joinpath(*parts)

    def _check_target(self, fd: int, parts: list[str]) -> None:
        try:
            mode = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISLNK(mode):
            raise UnsafeOutput(
                f"{self._shown(parts)} is a symlink; fa-images does not write through links it did not make "
                "(remove it, and run again)"
            )
        if not stat.S_ISREG(mode):
            raise UnsafeOutput(f"{self._shown(parts)} must be a file, but it is {kind_of(mode)}")

    def _write(self, rel: Rel, fill: Callable[[int], None], mode: int, *, replace: bool = True) -> Path:
        parts = _parts(rel)
        with self._dir_fd(parts[:-1], create=True) as fd:
            self._check_target(fd, parts)
            if not replace and self.kind(rel) is not None:
                raise UnsafeOutput(f"{self._shown(parts)} already exists; nothing was written")
            tmp = _temp_name(parts[-1])
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=fd)
            try:
                try:
                    fill(out)
                    os.fsync(out)
                    os.fchmod(out, mode)
                finally:
                    os.close(out)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=fd)
                raise
            if replace:
                _rename_in(fd, tmp, parts[-1])
            else:
                _link_in(fd, tmp, parts[-1], self._shown(parts))
        return self.path.joinpath(*parts)

    def create_text(self, rel: Rel, text: str, *, mode: int = 0o644) -> Path:
        """Writes ``rel`` only where nothing is: a file that appeared meanwhile is never replaced."""
        data = text.encode("utf-8")

        def fill(out: int) -> None:
            view = memoryview(data)
            while view:
                view = view[os.write(out, view) :]

        return self._write(rel, fill, mode, replace=False)

    def write_bytes(self, rel: Rel, data: bytes, *, mode: int = 0o644) -> Path:
        """Writes ``rel`` atomically: a temporary file beside it, then a rename over it."""

        def fill(out: int) -> None:
            view = memoryview(data)
            while view:
                view = view[os.write(out, view) :]

        return self._write(rel, fill, mode)

    def write_text(self, rel: Rel, text: str, *, mode: int = 0o644) -> Path:
        return self.write_bytes(rel, text.encode("utf-8"), mode=mode)

    def copy_in(self, rel: Rel, source: Path, *, mode: int = 0o644) -> Path:
        """Copies the regular file ``source`` to ``rel`` atomically."""

        def fill(out: int) -> None:
            with open_regular(source, what="wheel") as src, os.fdopen(os.dup(out), "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)

        return self._write(rel, fill, mode)

    def link_in(self, rel: Rel, source: Path, *, mode: int = 0o644) -> Path:
        """Puts ``source`` at ``rel`` atomically and leaves ``source`` where it is: a hard link on
        the same filesystem (no bytes copied), else a copy. A caller that moves a file in removes
        the source once its whole change is done, so a change undone leaves the source in place."""
        parts = _parts(rel)
        with self._dir_fd(parts[:-1], create=True) as fd:
            self._check_target(fd, parts)
            with open_regular(source, what="wheel") as src:
                same_fs = os.fstat(src.fileno()).st_dev == os.fstat(fd).st_dev
            if same_fs:
                tmp = _temp_name(parts[-1])
                os.link(source, tmp, dst_dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISREG(os.stat(tmp, dir_fd=fd, follow_symlinks=False).st_mode):
                    os.unlink(tmp, dir_fd=fd)  # swapped for a link since it was opened
                    raise UnsafeOutput(f"{source} is not a regular file; nothing was written")
                os.chmod(tmp, mode, dir_fd=fd)
                _rename_in(fd, tmp, parts[-1])
                return self.path.joinpath(*parts)
        return self.copy_in(rel, source, mode=mode)

    def read_bytes(self, rel: Rel, *, limit: int) -> bytes | None:
        """The bytes of the regular file ``rel`` (at most ``limit``), or None where nothing is;
        no link followed on the way."""
        parts = _parts(rel)
        try:
            with self._dir_fd(parts[:-1], create=False) as fd:
                return read_file(parts[-1], limit=limit, what="file", dir_fd=fd, follow_symlinks=False)
        except (UnsafeOutput, UntrustedInput) as exc:
            if not os.path.lexists(self.path.joinpath(*parts)):
                return None  # nothing there (or no folder for it yet)
            raise UnsafeOutput(str(exc)) from None

    def rename(self, old: Rel, new: Rel) -> Path:
        """Renames ``old`` to ``new`` in the same folder; ``new`` must not exist (nor be a link)."""
        old_parts, new_parts = _parts(old), _parts(new)
        if old_parts[:-1] != new_parts[:-1]:
            raise UnsafeOutput(f"{old} and {new} are not in the same folder")
        with self._dir_fd(old_parts[:-1], create=False) as fd:
            if self.kind(new) is not None:
                raise UnsafeOutput(f"{self._shown(new_parts)} is in the way")
            os.rename(old_parts[-1], new_parts[-1], src_dir_fd=fd, dst_dir_fd=fd)
        return self.path.joinpath(*new_parts)

    def open_text(self, rel: Rel) -> TextIO:
        """``rel`` opened for writing a stream (a log), truncated: never through a symlink, and
        only a regular file (O_NOFOLLOW, then fstat)."""
        parts = _parts(rel)
        with self._dir_fd(parts[:-1], create=True) as fd:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
            try:
                out = os.open(parts[-1], flags, 0o644, dir_fd=fd)
            except OSError as exc:
                raise self._refusal(parts, exc, fd) from None
        mode = os.fstat(out).st_mode
        if not stat.S_ISREG(mode):
            os.close(out)
            raise UnsafeOutput(f"{self._shown(parts)} must be a file, but it is {kind_of(mode)}")
        os.set_blocking(out, True)
        return os.fdopen(out, "w", encoding="utf-8")

    def remove_file(self, rel: Rel) -> bool:
        """Removes ``rel`` if it is a regular file (a link or directory there is left alone)."""
        parts = _parts(rel)
        try:
            with self._dir_fd(parts[:-1], create=False) as fd:
                if not stat.S_ISREG(os.stat(parts[-1], dir_fd=fd, follow_symlinks=False).st_mode):
                    return False
                os.unlink(parts[-1], dir_fd=fd)
        except (FileNotFoundError, UnsafeOutput):
            return False
        return True

    def remove_owned_dir(self, rel: Rel, owned: Callable[[str], bool]) -> bool:
        """Removes the regular files of ``rel`` that ``owned`` says fa-images wrote, then the
        directory if that left it empty. Nothing else in it is touched; True if it went."""
        parts = _parts(rel)
        try:
            with self._dir_fd(parts, create=False) as fd:
                for name in os.listdir(fd):
                    if owned(name) and stat.S_ISREG(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                        os.unlink(name, dir_fd=fd)
            with self._dir_fd(parts[:-1], create=False) as parent:
                os.rmdir(parts[-1], dir_fd=parent)
        except (FileNotFoundError, UnsafeOutput):
            return False
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                return False
            raise
        return True

    def remove_tree(self, rel: Rel) -> None:
        """Removes a directory tree fa-images made (the caller's record says so). A symlink in
        its place is refused; links inside it are removed, never followed (shutil's fd walk)."""
        parts = _parts(rel)
        with self._dir_fd(parts, create=False):
            pass  # refuses a link at any component
        shutil.rmtree(self.path.joinpath(*parts))

    def list(self, rel: Rel | None = None) -> list[str]:
        """Names in ``rel`` (or the top), without following a link to get there."""
        parts = _parts(rel) if rel is not None else []
        if parts and self.kind(PurePosixPath(*parts)) is None:
            return []  # nothing there yet
        with self._dir_fd(parts, create=False) as fd:
            return sorted(os.listdir(fd))


def _what_is(dir_fd: int, name: str) -> str:
    """What ``name`` in ``dir_fd`` really is ('a symlink', 'a FIFO', 'a file'...), not following a link."""
    try:
        return kind_of(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return "not a directory"


def _rename_in(fd: int, tmp: str, name: str) -> None:
    """Renames ``tmp`` over ``name`` inside the directory ``fd``; a failed rename leaves no ``tmp``."""
    try:
        os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=fd)
        raise


def _link_in(fd: int, tmp: str, name: str, shown: str) -> None:
    """Links ``tmp`` as ``name`` (which must not exist: link, unlike rename, never replaces), then
    removes ``tmp``."""
    try:
        os.link(tmp, name, src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
    except FileExistsError:
        raise UnsafeOutput(f"{shown} already exists; nothing was written") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=fd)


def _temp_name(name: str) -> str:
    return f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"


def write_file(path: Path, text: str, *, what: str = "--out") -> Path:
    """Writes one file the user named (``--out FILE``): its folder is made if needed and
    checked, the file replaced atomically, never written through a link or over a folder."""
    path = Path(path)
    if path.name in ("", ".", ".."):
        raise UnsafeOutput(f"{what} {path} is not a file name")
    return OutputDir(path.parent, what=f"{what}'s folder").write_text(path.name, text)

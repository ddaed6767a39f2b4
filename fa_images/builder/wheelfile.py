"""What pip sees in a wheel: the one reader of a wheel's archive for every judge of it.

A wheel's file name says its project, version and tags (read with ``packaging``). pip then
takes the one top-level ``*.dist-info`` directory, refuses a wheel with none or several, or
whose directory is not the file's project, reads ``WHEEL`` (its Wheel-Version must be 1.x)
and ``METADATA`` from that directory only, and refuses to install a member outside the
target directory. A wheel is read here the same way, and a member name pip would install
elsewhere (absolute, with ``..``, a backslash or a drive) is refused outright: ``inspect``,
``dist merge`` (and its PEP 658 ``.metadata``) and ``build --wheels`` judge what pip installs.

Stdlib and packaging only, Python 3.9: this module travels into every build context.
"""

from __future__ import annotations

import contextlib
import lzma
import re
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, NormalizedName, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from . import untrusted

# What reading a member of a damaged or crafted zip raises: a bad header or CRC, a corrupt deflate or
# lzma stream (bzip2's is an OSError), a truncated archive, an encrypted member (RuntimeError), a
# compression method zipfile lacks (NotImplementedError). Every reader of a wheel catches these.
DAMAGED = (zipfile.BadZipFile, zlib.error, lzma.LZMAError, EOFError, RuntimeError, NotImplementedError)

MAX_METADATA = 4 << 20  # METADATA of real projects is a few kB, a long README a few hundred
MAX_WHEEL_FILE = 64 << 10
MAX_MEMBERS = 100_000
# A member of a shared-object name: flash_attn_2_cuda.cpython-312-x86_64-linux-gnu.so, libx.so.1
_SHARED_OBJECT = re.compile(r"\.so(\.\d+)*$")


class BadWheel(ValueError):
    """A wheel pip would refuse, or one whose members would land outside the install."""


@dataclass
class Wheel:
    """An open wheel: its name's parts, its one dist-info directory and its member names."""

    path: Path
    name: NormalizedName
    version: Version
    tags: frozenset[Tag]
    zf: zipfile.ZipFile
    dist_info: str
    members: list[str]

    @property
    def shown(self) -> str:
        return untrusted.shown(self.path.name)

    def read(self, member: str, limit: int) -> bytes | None:
        """A member's bytes, at most ``limit`` of them; None where the wheel has no such member."""
        try:
            info = self.zf.getinfo(member)
        except KeyError:
            return None
        if info.file_size > limit:
            raise BadWheel(f"{self.shown}: {untrusted.shown(member)} is larger than {limit >> 10} KiB")
        try:
            with self.zf.open(info) as f:
                data = f.read(limit + 1)
        except (*DAMAGED, OSError) as exc:
            raise BadWheel(f"{self.shown} is a damaged wheel: {exc}") from None
        if len(data) > limit:
            raise BadWheel(f"{self.shown}: {untrusted.shown(member)} inflates past its declared size")
        return data

    def head(self, member: str, size: int) -> bytes:
        """The first ``size`` bytes of a member (less where it is shorter)."""
        try:
            with self.zf.open(member) as f:
                return f.read(size)
        except (*DAMAGED, OSError) as exc:
            raise BadWheel(f"{self.shown} is a damaged wheel: {exc}") from None

    def metadata(self) -> bytes | None:
        """``{dist-info}/METADATA``, the only one pip reads; None where it is missing."""
        return self.read(f"{self.dist_info}/METADATA", MAX_METADATA)

    def shared_objects(self) -> list[str]:
        """Every member that is a shared library: the extensions pip installs."""
        return [m for m in self.members if _SHARED_OBJECT.search(m)]


def unsafe_member(name: str) -> str | None:
    """Why pip would install ``name`` outside the target directory (or on some system would),
    or None. Zip names use ``/``; a backslash or a drive is a path on Windows."""
    if not name or "\0" in name:
        return "an empty name or a NUL"
    if name.startswith("/"):
        return "an absolute path"
    if "\\" in name:
        return "a backslash"
    if re.match(r"[A-Za-z]:", name):
        return "a drive letter"
    if ".." in name.split("/"):
        return "a '..' component"
    return None


def _dist_info(path: Path, name: NormalizedName, members: list[str]) -> str:
    """The one top-level ``.dist-info`` directory, which must be the file name's project's
    (``{name}-{version}.dist-info``). Its version part is not compared, as pip does not:
    the Version in its METADATA is what counts, and the verifier compares that."""
    shown = untrusted.shown(path.name)
    found = sorted({m.split("/", 1)[0] for m in members if "/" in m and m.split("/", 1)[0].endswith(".dist-info")})
    if not found:
        raise BadWheel(f"{shown} has no .dist-info directory: pip would refuse it")
    if len(found) > 1:
        listed = untrusted.shown(", ".join(found))
        raise BadWheel(f"{shown} has {len(found)} .dist-info directories ({listed}): pip would refuse it")
    directory = found[0]
    stem = directory.removesuffix(".dist-info")
    if canonicalize_name(stem.rpartition("-")[0] or stem) != name:
        raise BadWheel(f"{shown}: its {untrusted.shown(directory)} is not the dist-info of {name}: pip would refuse it")
    return directory


def _check_wheel_file(wheel: Wheel) -> None:
    """pip refuses a wheel without ``WHEEL`` or with a Wheel-Version it does not know (2.0 and on)."""
    data = wheel.read(f"{wheel.dist_info}/WHEEL", MAX_WHEEL_FILE)
    if data is None:
        raise BadWheel(f"{wheel.shown} has no {untrusted.shown(wheel.dist_info)}/WHEEL: pip would refuse it")
    match = re.search(rb"^Wheel-Version:[ \t]*(\d+)\.\d+[ \t]*\r?$", data, re.MULTILINE)
    if not match or match.group(1) != b"1":
        raise BadWheel(f"{wheel.shown}: its WHEEL has no Wheel-Version 1.x: pip would refuse it")


@contextlib.contextmanager
def open_wheel(path: Path) -> Iterator[Wheel]:
    """``path`` read as pip reads it; BadWheel for a wheel pip refuses or one that is unsafe."""
    shown = untrusted.shown(path.name)
    try:
        name, version, _build, tags = parse_wheel_filename(path.name)
    except (InvalidWheelFilename, InvalidVersion) as exc:
        raise BadWheel(f"{shown} is not a wheel file name: {untrusted.shown(str(exc))}") from None
    try:
        f: BinaryIO = untrusted.open_regular(path, what="wheel")
    except untrusted.UntrustedInput as exc:
        raise BadWheel(str(exc)) from None
    with f:
        try:
            zf = zipfile.ZipFile(f)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
            raise BadWheel(f"{shown} is not a readable wheel: {exc}") from None
        with zf:
            infos = zf.infolist()
            if len(infos) > MAX_MEMBERS:
                raise BadWheel(f"{shown} holds {len(infos)} members, more than {MAX_MEMBERS}")
            members = [i.filename for i in infos]
            seen: set[str] = set()
            for member in members:
                why = unsafe_member(member)
                if why:
                    raise BadWheel(
                        f"{shown} has a member with {why} ({untrusted.shown(member)}): it would install outside"
                    )
                if member in seen:
                    raise BadWheel(f"{shown} holds {untrusted.shown(member)} twice")
                seen.add(member)
            wheel = Wheel(path, name, version, tags, zf, _dist_info(path, name, members), members)
            _check_wheel_file(wheel)
            yield wheel

"""Just enough ELF reading to judge a compiled extension without binutils or a GPU.

Two questions: which symbols does the library import (its C++ ABI shows in their
mangled names), and which GPU archs does its ``.nv_fatbin`` section carry.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from . import untrusted

SHT_DYNSYM = 11
SHT_NOBITS = 8  # .bss: takes no room in the file
FATBIN_MAGIC = 0xBA55ED50
FATBIN_KIND_PTX = 1
FATBIN_KIND_CUBIN = 2


class ElfError(ValueError):
    pass


_T = TypeVar("_T")
# A fat binary's own headers; an entry or container shorter than these is corrupt.
FATBIN_HEADER = 16
FATBIN_ENTRY_HEADER = 32


def _readers(func: Callable[..., _T]) -> Callable[..., _T]:
    """Every way bytes can be malformed becomes one ElfError (the file is untrusted)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> _T:
        try:
            return func(*args, **kwargs)
        except ElfError:
            raise
        except (struct.error, IndexError, OverflowError, ValueError, untrusted.UntrustedInput) as exc:
            raise ElfError(str(exc) or type(exc).__name__) from None

    return wrapper


@dataclass(frozen=True)
class Section:
    name: str
    type: int
    offset: int
    size: int
    link: int
    entsize: int


def _sections(data: mmap.mmap | bytes) -> list[Section]:
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ElfError("not a little-endian 64-bit ELF file")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shentsize < 64 or shstrndx >= shnum or shoff + shnum * shentsize > len(data):
        raise ElfError("its section header table is corrupt")
    raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_at = raw[shstrndx][4]
    if any(r[1] != SHT_NOBITS and r[4] + r[5] > len(data) for r in raw):
        raise ElfError("a section lies outside the file")

    def name(offset: int) -> str:
        start = names_at + offset
        return bytes(data[start : data.find(b"\0", start)]).decode()

    return [Section(name(r[0]), r[1], r[4], r[5], r[6], r[9]) for r in raw]


def _with_strings(data: mmap.mmap | bytes, kind: int, what: str) -> Iterator[tuple[Section, Section]]:
    """Each section of type ``kind`` with the string table it links to (refused if it links to none)."""
    sections = _sections(data)
    for sec in sections:
        if sec.type != kind:
            continue
        if sec.link >= len(sections):
            raise ElfError(f"its {sec.name or what} section names no string table")
        yield sec, sections[sec.link]


@contextlib.contextmanager
def _mapped(path: Path) -> Iterator[mmap.mmap]:
    """The file, mapped read-only; a regular file only (a FIFO would block, a device never end)."""
    with untrusted.open_regular(path, what="shared library") as f:
        if not os.fstat(f.fileno()).st_size:
            raise ElfError("the file is empty")
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            yield data
        finally:
            data.close()


@_readers
def undefined_dynamic_symbols(path: Path) -> list[str]:
    """Names the library expects others (torch, libstdc++, CUDA) to provide."""
    with _mapped(path) as data:
        sections = _sections(data)
        names: list[str] = []
        for sec in sections:
            if sec.type != SHT_DYNSYM:
                continue
            if sec.entsize < 24 or sec.link >= len(sections):
                raise ElfError(f"its {sec.name or 'dynamic symbol'} table is corrupt")
            strtab = sections[sec.link]
            for i in range(sec.size // sec.entsize):
                st_name, _info, _other, st_shndx = struct.unpack_from("<IBBH", data, sec.offset + i * sec.entsize)
                if st_shndx == 0 and st_name:
                    start = strtab.offset + st_name
                    names.append(bytes(data[start : data.find(b"\0", start)]).decode(errors="replace"))
        return names


@_readers
def fatbin_archs(path: Path) -> tuple[set[str], set[str]]:
    """(cubin archs, PTX archs) in the library's fat binaries, as strings like '80'."""
    with _mapped(path) as data:
        return read_fatbins(data, [(s.offset, s.offset + s.size) for s in _sections(data) if s.name == ".nv_fatbin"])


def read_fatbins(data: mmap.mmap | bytes, spans: list[tuple[int, int]]) -> tuple[set[str], set[str]]:
    """The archs of the fat binaries in ``data[start:end]`` for each span. Every step moves
    forward by at least a header, so a container or entry that claims size 0 cannot loop."""
    cubins: set[str] = set()
    ptx: set[str] = set()
    for pos, end in spans:
        end = min(end, len(data))
        while pos + FATBIN_HEADER <= end:
            magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", data, pos)
            if magic != FATBIN_MAGIC:  # containers are 8-byte aligned; skip padding
                pos += 8
                continue
            if header_size < FATBIN_HEADER:
                raise ElfError(f"a fat binary at offset {pos} has a header of {header_size} bytes")
            entry, entries_end = pos + header_size, min(pos + header_size + fat_size, end)
            while entry + FATBIN_ENTRY_HEADER <= entries_end:
                kind, _v, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
                if entry_header < FATBIN_ENTRY_HEADER:
                    raise ElfError(f"a fat binary entry at offset {entry} has a header of {entry_header} bytes")
                arch = struct.unpack_from("<I", data, entry + 28)[0]
                (ptx if kind == FATBIN_KIND_PTX else cubins).add(str(arch))
                entry += entry_header + payload
            pos = max(entries_end, pos + FATBIN_HEADER)
    return cubins, ptx


# --- symbol versions: the glibc and libstdc++ a library needs ---------------------------------

SHT_GNU_VERDEF = 0x6FFFFFFD
SHT_GNU_VERNEED = 0x6FFFFFFE
_VERNEED = struct.Struct("<HHIII")  # vn_version, vn_cnt, vn_file, vn_aux, vn_next
_VERNAUX = struct.Struct("<IHHII")  # vna_hash, vna_flags, vna_other, vna_name, vna_next
_VERDEF = struct.Struct("<HHHHIII")  # vd_version, vd_flags, vd_ndx, vd_cnt, vd_hash, vd_aux, vd_next
_VERDAUX = struct.Struct("<II")  # vda_name, vda_next
MAX_NAME = 4096  # a version or library name longer than this is not one a linker wrote


def _string(data: mmap.mmap | bytes, strtab: Section, offset: int) -> str:
    """A NUL-terminated name inside ``strtab``; refuses one that runs past the table."""
    if strtab.type == SHT_NOBITS or offset >= strtab.size:
        raise ElfError("a version name points outside its string table")
    start = strtab.offset + offset
    end = data.find(b"\0", start, min(strtab.offset + strtab.size, start + MAX_NAME))
    if end < 0:
        raise ElfError("a version name is not terminated inside its string table")
    return bytes(data[start:end]).decode(errors="replace")


def _records(sec: Section, first: int, size: int, next_at: int, unpack, data) -> list[tuple]:
    """A chain of fixed-size records inside ``sec``: each one's ``next`` is relative to it.

    Bounded: every record must lie inside the section, and a chain can hold no more records
    than fit in the section, so a hostile ``next`` (0 ends a chain) cannot loop or run away.
    """
    out: list[tuple] = []
    if sec.size == 0:
        return out
    pos = first
    for _ in range(sec.size // size + 1):
        if pos < 0 or pos + size > sec.size:
            raise ElfError(f"its {sec.name or 'version'} section is corrupt")
        fields = unpack.unpack_from(data, sec.offset + pos)
        out.append(fields)
        if fields[next_at] == 0:
            return out
        pos += fields[next_at]
    raise ElfError(f"its {sec.name or 'version'} section is corrupt (a chain longer than the section)")


@_readers
def needed_versions(path: Path) -> dict[str, set[str]]:
    """{library: symbol versions the file needs from it}, from ``.gnu.version_r``.

    E.g. ``{"libc.so.6": {"GLIBC_2.2.5", "GLIBC_2.34"}, "libstdc++.so.6": {"GLIBCXX_3.4.29", ...}}``.
    """
    with _mapped(path) as data:
        needed: dict[str, set[str]] = {}
        for sec, strtab in _with_strings(data, SHT_GNU_VERNEED, "version"):
            pos = 0
            for _vn_version, vn_cnt, vn_file, vn_aux, vn_next in _records(sec, 0, _VERNEED.size, 4, _VERNEED, data):
                library = needed.setdefault(_string(data, strtab, vn_file), set())
                if vn_cnt:
                    for aux in _records(sec, pos + vn_aux, _VERNAUX.size, 4, _VERNAUX, data)[:vn_cnt]:
                        library.add(_string(data, strtab, aux[3]))
                pos += vn_next
        return needed


@_readers
def defined_versions(path: Path) -> set[str]:
    """The symbol versions a library defines (``.gnu.version_d``), e.g. libstdc++'s GLIBCXX_3.4.x."""
    with _mapped(path) as data:
        defined: set[str] = set()
        for sec, strtab in _with_strings(data, SHT_GNU_VERDEF, "version"):
            pos = 0
            for fields in _records(sec, 0, _VERDEF.size, 6, _VERDEF, data):
                (name_at, _next) = _records(sec, pos + fields[5], _VERDAUX.size, 1, _VERDAUX, data)[0]
                defined.add(_string(data, strtab, name_at))
                pos += fields[6]
        return defined


def version_key(version: str) -> tuple[int, ...]:
    """'GLIBC_2.34' -> (2, 34); 'GLIBCXX_3.4.30' -> (3, 4, 30); () where no numbers follow."""
    numbers = version.rpartition("_")[2].split(".")
    return tuple(int(n) for n in numbers) if all(n.isdigit() for n in numbers) else ()


def highest(versions: set[str] | list[str], prefix: str) -> str | None:
    """The highest ``{prefix}_x.y[.z]`` among ``versions``, or None."""
    ours = [v for v in versions if v.startswith(prefix + "_") and version_key(v)]
    return max(ours, key=version_key) if ours else None


SHT_DYNAMIC = 6
DT_NEEDED = 1
_DYN = struct.Struct("<qQ")  # d_tag, d_val


@_readers
def needed_libraries(path: Path) -> list[str]:
    """The DT_NEEDED names of the file's dynamic section: the libraries the loader must find."""
    with _mapped(path) as data:
        names: list[str] = []
        for sec, strtab in _with_strings(data, SHT_DYNAMIC, "dynamic"):
            for i in range(sec.size // _DYN.size):
                tag, value = _DYN.unpack_from(data, sec.offset + i * _DYN.size)
                if tag == 0:  # DT_NULL ends the table
                    break
                if tag == DT_NEEDED:
                    names.append(_string(data, strtab, value))
        return names

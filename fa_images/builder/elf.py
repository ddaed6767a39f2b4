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

"""Just enough ELF reading to judge a compiled extension without binutils or a GPU.

Two questions: which symbols does the library import (its C++ ABI shows in their
mangled names), and which GPU archs does its ``.nv_fatbin`` section carry.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

SHT_DYNSYM = 11
SHT_NOBITS = 8  # .bss: takes no room in the file
FATBIN_MAGIC = 0xBA55ED50
FATBIN_KIND_PTX = 1
FATBIN_KIND_CUBIN = 2


class ElfError(ValueError):
    pass


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


def _open(path: Path):
    f = path.open("rb")
    return f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def undefined_dynamic_symbols(path: Path) -> list[str]:
    """Names the library expects others (torch, libstdc++, CUDA) to provide."""
    f, data = _open(path)
    try:
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
    finally:
        data.close()
        f.close()


def fatbin_archs(path: Path) -> tuple[set[str], set[str]]:
    """(cubin archs, PTX archs) in the library's fat binaries, as strings like '80'."""
    f, data = _open(path)
    cubins: set[str] = set()
    ptx: set[str] = set()
    try:
        for sec in _sections(data):
            if sec.name != ".nv_fatbin":
                continue
            pos, end = sec.offset, sec.offset + sec.size
            while pos + 16 <= end:
                magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", data, pos)
                if magic != FATBIN_MAGIC:  # containers are 8-byte aligned; skip padding
                    pos += 8
                    continue
                entry, entries_end = pos + header_size, pos + header_size + fat_size
                while entry + 32 <= entries_end:
                    kind, _v, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
                    arch = struct.unpack_from("<I", data, entry + 28)[0]
                    (ptx if kind == FATBIN_KIND_PTX else cubins).add(str(arch))
                    entry += entry_header + payload
                pos = entries_end
        return cubins, ptx
    finally:
        data.close()
        f.close()

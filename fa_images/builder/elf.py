"""Just enough ELF reading to judge a compiled extension without binutils or a GPU.

Two questions: which symbols does the library import (its C++ ABI shows in their
mangled names), and which GPU archs does its ``.nv_fatbin`` section carry.

The file is untrusted, and a few kB of it can describe chains and tables that point at each
other. So every walk is bounded by its declared count and by the bytes of its section, no
record is visited twice, the sections a reader walks may not overlap, and each read keeps a
``Work`` count that may not grow past a constant times the file's size: the work is linear.
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
# Work a read may do per byte of the file, and a floor for tiny files. Records are at least
# 8 bytes and each is visited once, so structure costs at most size/8; the rest is for names
# (a name is read once per offset, but suffix-shared names may overlap a few times over).
WORK_PER_BYTE = 16
WORK_FLOOR = 1 << 16


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


class Work:
    """What one read of one file did: ``records`` visited and ``name_bytes`` read. Refuses the
    file once their sum passes ``limit`` (by default WORK_PER_BYTE times its size, plus a floor);
    ``limit=None`` counts without refusing, for tests that show the walks are linear on their own."""

    def __init__(self, size: int, *, limit: int | None = -1) -> None:
        self.limit = WORK_PER_BYTE * size + WORK_FLOOR if limit == -1 else limit
        self.records = 0
        self.name_bytes = 0

    @property
    def steps(self) -> int:
        return self.records + self.name_bytes

    def record(self, count: int = 1) -> None:
        self.records += count
        self._check()

    def names(self, count: int) -> None:
        self.name_bytes += count
        self._check()

    def _check(self) -> None:
        if self.limit is not None and self.steps > self.limit:
            raise ElfError("reading it takes more work than its size allows: its records repeat or overlap")


@dataclass(frozen=True)
class Section:
    name: str
    type: int
    offset: int
    size: int
    link: int
    entsize: int
    info: int = 0

    @property
    def end(self) -> int:
        return self.offset + self.size


MAX_SECTION_NAME = 256


def _sections(data: mmap.mmap | bytes, work: Work) -> list[Section]:
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ElfError("not a little-endian 64-bit ELF file")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shentsize < 64 or shstrndx >= shnum or shoff + shnum * shentsize > len(data):
        raise ElfError("its section header table is corrupt")
    work.record(shnum)
    raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    if any(r[1] != SHT_NOBITS and r[4] + r[5] > len(data) for r in raw):
        raise ElfError("a section lies outside the file")
    names = Section("", raw[shstrndx][1], raw[shstrndx][4], raw[shstrndx][5], 0, 0)
    strings = Strings(data, names, work, limit=MAX_SECTION_NAME, what="section name")
    return [Section(strings.at(r[0]), r[1], r[4], r[5], r[6], r[9], r[7]) for r in raw]


def _walked(sections: list[Section], chosen: Callable[[Section], bool], what: str) -> list[Section]:
    """The sections one reader walks: none may overlap another, or the same bytes would be
    walked once per copy (a few kB of headers can name one big table many times)."""
    found = sorted((s for s in sections if chosen(s) and s.type != SHT_NOBITS), key=lambda s: s.offset)
    for before, after in zip(found, found[1:]):
        if after.offset < before.end:
            raise ElfError(f"its {before.name or what} and {after.name or what} sections overlap")
    return found


def _with_strings(data: mmap.mmap | bytes, kind: int, what: str, work: Work) -> Iterator[tuple[Section, Strings]]:
    """Each section of type ``kind`` with the string table it links to (refused if it links to none)."""
    sections = _sections(data, work)
    tables: dict[int, Strings] = {}
    for sec in _walked(sections, lambda s: s.type == kind, what):
        if sec.link >= len(sections):
            raise ElfError(f"its {sec.name or what} section names no string table")
        if sec.link not in tables:
            tables[sec.link] = Strings(data, sections[sec.link], work)
        yield sec, tables[sec.link]


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


def _read(path: Path, reader: Callable[[mmap.mmap, Work], _T]) -> _T:
    with _mapped(path) as data:
        return reader(data, Work(len(data)))


MAX_NAME = 4096  # a version or library name longer than this is not one a linker wrote
MAX_SYMBOL = 1 << 16  # mangled C++ template names run long, but not this long


class Strings:
    """Names in one string table: each must end inside the table, and each offset is read once
    (many records may name the same string; that costs one read, not one per record)."""

    def __init__(
        self, data: mmap.mmap | bytes, table: Section, work: Work, *, limit: int = MAX_NAME, what: str = "version name"
    ) -> None:
        self.data, self.table, self.work, self.limit, self.what = data, table, work, limit, what
        self.seen: dict[int, str] = {}

    def at(self, offset: int) -> str:
        if offset in self.seen:
            return self.seen[offset]
        table = self.table
        if table.type == SHT_NOBITS or offset >= table.size:
            raise ElfError(f"a {self.what} points outside its string table")
        start = table.offset + offset
        end = self.data.find(b"\0", start, min(table.end, start + self.limit))
        self.work.names(max(end, start + 1) - start)
        if end < 0:
            raise ElfError(f"a {self.what} is not terminated inside its string table")
        self.seen[offset] = name = bytes(self.data[start:end]).decode(errors="replace")
        return name


@_readers
def undefined_dynamic_symbols(path: Path) -> list[str]:
    """Names the library expects others (torch, libstdc++, CUDA) to provide."""
    return _read(path, read_undefined_dynamic_symbols)


def read_undefined_dynamic_symbols(data: mmap.mmap | bytes, work: Work) -> list[str]:
    names: list[str] = []
    for sec, strings in _with_strings(data, SHT_DYNSYM, "dynamic symbol", work):
        if sec.entsize < 24:
            raise ElfError(f"its {sec.name or 'dynamic symbol'} table is corrupt")
        strings.limit, strings.what = MAX_SYMBOL, "symbol name"
        for i in range(sec.size // sec.entsize):
            work.record()
            st_name, _info, _other, st_shndx = struct.unpack_from("<IBBH", data, sec.offset + i * sec.entsize)
            if st_shndx == 0 and st_name:
                names.append(strings.at(st_name))
    return names


@_readers
def fatbin_archs(path: Path) -> tuple[set[str], set[str]]:
    """(cubin archs, PTX archs) in the library's fat binaries, as strings like '80'."""
    return _read(path, read_fatbin_archs)


def read_fatbin_archs(data: mmap.mmap | bytes, work: Work) -> tuple[set[str], set[str]]:
    spans = [(s.offset, s.end) for s in _walked(_sections(data, work), lambda s: s.name == ".nv_fatbin", "fatbin")]
    return read_fatbins(data, spans, work)


def read_fatbins(
    data: mmap.mmap | bytes, spans: list[tuple[int, int]], work: Work | None = None
) -> tuple[set[str], set[str]]:
    """The archs of the fat binaries in ``data[start:end]`` for each span. Every step moves
    forward by at least a header, so a container or entry that claims size 0 cannot loop."""
    work = work or Work(len(data))
    cubins: set[str] = set()
    ptx: set[str] = set()
    for pos, end in spans:
        end = min(end, len(data))
        while pos + FATBIN_HEADER <= end:
            work.record()
            magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", data, pos)
            if magic != FATBIN_MAGIC:  # containers are 8-byte aligned; skip padding
                pos += 8
                continue
            if header_size < FATBIN_HEADER:
                raise ElfError(f"a fat binary at offset {pos} has a header of {header_size} bytes")
            entry, entries_end = pos + header_size, min(pos + header_size + fat_size, end)
            while entry + FATBIN_ENTRY_HEADER <= entries_end:
                work.record()
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


class _Records:
    """The fixed-size records of one version section, each read at most once: a record must lie
    inside the section and share no byte with one read before (a linker never lets two chains
    share records, so a ``next`` or ``aux`` that reaches read bytes is a cycle or an overlap)."""

    def __init__(self, data: mmap.mmap | bytes, sec: Section, work: Work) -> None:
        self.data, self.sec, self.work = data, sec, work
        self.taken = bytearray(sec.size)

    def chain(self, first: int, unpack: struct.Struct, next_at: int, count: int = 0) -> Iterator[tuple]:
        """The records from ``first``, each one's ``next`` relative to it, until a 0 ``next`` or
        ``count`` records (the declared count; 0: as many as fit in the section, and no more)."""
        if not self.sec.size:  # an empty section holds no chain
            return
        pos = first
        for _ in range(count or self.sec.size // unpack.size):
            fields = self.read(pos, unpack)
            yield fields
            if fields[next_at] == 0:
                return
            pos += fields[next_at]
        if not count:
            raise ElfError(f"its {self.sec.name or 'version'} section is corrupt: a chain longer than the section")

    def read(self, pos: int, unpack: struct.Struct, *, shared: bool = False) -> tuple:
        """The record at ``pos``; ``shared``: one that others may also name (it is not taken)."""
        sec, end = self.sec, pos + unpack.size
        if pos < 0 or end > sec.size:
            raise ElfError(f"its {sec.name or 'version'} section is corrupt: a record lies outside it")
        # 1 marks a record read once and only once, 2 one that may be read again
        if 1 in self.taken[pos:end] or (not shared and any(self.taken[pos:end])):
            raise ElfError(f"its {sec.name or 'version'} section is corrupt: records overlap or a chain loops")
        self.work.record()
        self.taken[pos:end] = (b"\2" if shared else b"\1") * unpack.size
        return unpack.unpack_from(self.data, sec.offset + pos)


@_readers
def needed_versions(path: Path) -> dict[str, set[str]]:
    """{library: symbol versions the file needs from it}, from ``.gnu.version_r``.

    E.g. ``{"libc.so.6": {"GLIBC_2.2.5", "GLIBC_2.34"}, "libstdc++.so.6": {"GLIBCXX_3.4.29", ...}}``.
    """
    return _read(path, read_needed_versions)


def read_needed_versions(data: mmap.mmap | bytes, work: Work) -> dict[str, set[str]]:
    needed: dict[str, set[str]] = {}
    for sec, strings in _with_strings(data, SHT_GNU_VERNEED, "version", work):
        records = _Records(data, sec, work)
        pos = 0
        # sh_info is the number of entries (DT_VERNEEDNUM), vn_cnt that of each one's versions
        for _vn_version, vn_cnt, vn_file, vn_aux, vn_next in records.chain(0, _VERNEED, 4, sec.info):
            library = needed.setdefault(strings.at(vn_file), set())
            if vn_cnt:
                for aux in records.chain(pos + vn_aux, _VERNAUX, 4, vn_cnt):
                    library.add(strings.at(aux[3]))
            pos += vn_next
    return needed


@_readers
def defined_versions(path: Path) -> set[str]:
    """The symbol versions a library defines (``.gnu.version_d``), e.g. libstdc++'s GLIBCXX_3.4.x."""
    return _read(path, read_defined_versions)


def read_defined_versions(data: mmap.mmap | bytes, work: Work) -> set[str]:
    defined: set[str] = set()
    for sec, strings in _with_strings(data, SHT_GNU_VERDEF, "version", work):
        records = _Records(data, sec, work)
        pos = 0
        for fields in records.chain(0, _VERDEF, 6, sec.info):
            if fields[3]:  # vd_cnt: the first aux names the version, the rest its parents
                # ld lets two definitions of one name share that aux; one read each stays linear
                name_at, _next = records.read(pos + fields[5], _VERDAUX, shared=True)
                defined.add(strings.at(name_at))
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
    return _read(path, read_needed_libraries)


def read_needed_libraries(data: mmap.mmap | bytes, work: Work) -> list[str]:
    names: list[str] = []
    for sec, strings in _with_strings(data, SHT_DYNAMIC, "dynamic", work):
        strings.what = "library name"
        for i in range(sec.size // _DYN.size):
            work.record()
            tag, value = _DYN.unpack_from(data, sec.offset + i * _DYN.size)
            if tag == 0:  # DT_NULL ends the table
                break
            if tag == DT_NEEDED:
                names.append(strings.at(value))
    return names


# --- the machine a file is for -----------------------------------------------------------------

# e_machine values (ELF gABI) and the class and byte order of the CPUs wheels are tagged for.
EM_386, EM_PPC64, EM_S390, EM_ARM, EM_X86_64, EM_AARCH64, EM_RISCV = 3, 21, 22, 40, 62, 183, 243
MACHINE_NAMES = {
    EM_386: "i386",
    EM_PPC64: "ppc64",
    EM_S390: "s390",
    EM_ARM: "arm",
    EM_X86_64: "x86_64",
    EM_AARCH64: "aarch64",
    EM_RISCV: "riscv",
}


@dataclass(frozen=True)
class Machine:
    """What an ELF header says the file runs on."""

    machine: int
    bits: int  # 32 or 64
    little: bool

    def __str__(self) -> str:
        name = MACHINE_NAMES.get(self.machine, f"machine {self.machine}")
        return f"{name} ({self.bits}-bit, {'little' if self.little else 'big'}-endian)"


# The architecture part of a platform tag (manylinux_2_28_x86_64 -> x86_64) and the ELF it needs.
ARCH_MACHINES = {
    "x86_64": Machine(EM_X86_64, 64, True),
    "i686": Machine(EM_386, 32, True),
    "aarch64": Machine(EM_AARCH64, 64, True),
    "armv7l": Machine(EM_ARM, 32, True),
    "ppc64le": Machine(EM_PPC64, 64, True),
    "ppc64": Machine(EM_PPC64, 64, False),
    "s390x": Machine(EM_S390, 64, False),
    "riscv64": Machine(EM_RISCV, 64, True),
}
ELF_HEADER = 20  # e_ident (16), e_type, e_machine


def machine_of(header: bytes) -> Machine:
    """The machine, class and byte order in the first ELF_HEADER bytes of a file."""
    if len(header) < ELF_HEADER or header[:4] != b"\x7fELF" or header[4] not in (1, 2) or header[5] not in (1, 2):
        raise ElfError("not an ELF file")
    little = header[5] == 1
    (machine,) = struct.unpack_from("<H" if little else ">H", header, 18)
    return Machine(machine, 32 if header[4] == 1 else 64, little)

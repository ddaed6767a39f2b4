"""The ELF readers' work is linear in the file's size, however its records point at each other.

Each reader keeps an ``elf.Work`` count of the records it visits and the name bytes it reads.
Files are crafted with the longest chains and the most overlap a few bytes can describe: version
entries that all share one chain of versions, many section headers over one table, many symbols
naming one long name. Counted with no limit, the records stay below the file's size over 8 (each
is read once) and the names below its size; a file whose names would cost more is refused.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fa_images.builder import elf

SHDR = struct.Struct("<IIQQQQIIQQ")
SYM = struct.Struct("<IBBHQQ")  # st_name, st_info, st_other, st_shndx, st_value, st_size
ENTSIZE = {elf.SHT_DYNSYM: SYM.size, elf.SHT_DYNAMIC: 16}
READERS = [
    elf.read_needed_versions,
    elf.read_defined_versions,
    elf.read_undefined_dynamic_symbols,
    elf.read_needed_libraries,
    elf.read_fatbin_archs,
]


def build(bodies: dict[str, bytes], headers: list[tuple[str, int, int, int, str]]) -> bytes:
    """An ELF64 LE file: ``bodies`` laid out once each, then one section header per
    (name, type, link, info, body) in ``headers``; several headers may cover one body.
    Header 0 is the null section, 1 is .shstrtab, ``headers`` follow from 2."""
    names = b"\0"
    name_at: dict[str, int] = {}
    for name in [".shstrtab"] + [h[0] for h in headers]:
        if name not in name_at:
            name_at[name] = len(names)
            names += name.encode() + b"\0"
    laid = {".shstrtab": names, **bodies}
    data = bytearray(64)
    offsets = {}
    for key, body in laid.items():
        data += bytes(-len(data) % 8)
        offsets[key] = len(data)
        data += body
    data += bytes(-len(data) % 8)
    shoff = len(data)
    data += bytes(SHDR.size)
    for name, kind, link, info, body in [(".shstrtab", 3, 0, 0, ".shstrtab"), *headers]:
        entsize = ENTSIZE.get(kind, 0)
        data += SHDR.pack(name_at[name], kind, 0, 0, offsets[body], len(laid[body]), link, info, 8, entsize)
    data[0:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<H", data, 18, elf.EM_X86_64)
    struct.pack_into("<Q", data, 0x28, shoff)
    struct.pack_into("<HHH", data, 0x3A, SHDR.size, len(headers) + 2, 1)
    return bytes(data)


DYNSTR = b"\0libc.so.6\0GLIBC_2.34\0"  # names at 1 and 11


def shared_versions(n: int) -> bytes:
    """n version entries, each claiming (vn_cnt) all n versions of one shared chain: n * n reads
    for a reader that walks each entry's chain to its end."""
    entries = b"".join(struct.pack("<HHIII", 1, n, 1, 16 * (n - i), 16 if i + 1 < n else 0) for i in range(n))
    chain = b"".join(struct.pack("<IHHII", 0, 0, 2, 11, 16 if j + 1 < n else 0) for j in range(n))
    return build(
        {".dynstr": DYNSTR, ".gnu.version_r": entries + chain},
        [(".dynstr", 3, 0, 0, ".dynstr"), (".gnu.version_r", elf.SHT_GNU_VERNEED, 2, n, ".gnu.version_r")],
    )


def shared_definitions(n: int) -> bytes:
    """n version definitions whose vd_aux all reach one name record (ld writes two that share
    one, as in libjansson's; each definition reads only its first aux, so this stays linear)."""
    defs = b"".join(struct.pack("<HHHHIII", 1, 0, i + 1, 1, 0, 20 * (n - i), 20 if i + 1 < n else 0) for i in range(n))
    return build(
        {".dynstr": DYNSTR, ".gnu.version_d": defs + struct.pack("<II", 11, 0)},
        [(".dynstr", 3, 0, 0, ".dynstr"), (".gnu.version_d", elf.SHT_GNU_VERDEF, 2, 0, ".gnu.version_d")],
    )


def repeated_tables(kind: int, copies: int, n: int) -> bytes:
    """One table of n records covered by ``copies`` section headers: copies * n reads for a
    reader that walks every header's table."""
    if kind == elf.SHT_DYNSYM:
        body, name = SYM.pack(0, 0, 0, 0, 0, 0) + SYM.pack(11, 0x12, 0, 0, 0, 0) * n, ".dynsym"
    elif kind == elf.SHT_DYNAMIC:
        body, name = struct.pack("<qQ", elf.DT_NEEDED, 1) * n + bytes(16), ".dynamic"
    else:
        entry = struct.pack("<HHIQ", elf.FATBIN_KIND_CUBIN, 0, 32, 0) + bytes(12) + struct.pack("<I", 80)
        body = struct.pack("<IHHQ", elf.FATBIN_MAGIC, 1, 16, 32 * n) + entry * n
        kind, name = 1, ".nv_fatbin"
    headers = [(".dynstr", 3, 0, 0, ".dynstr")] + [(name, kind, 2, 0, "table")] * copies
    return build({".dynstr": DYNSTR, "table": body}, headers)


def one_long_name(n: int, length: int) -> bytes:
    """n undefined symbols that all name one name of ``length`` bytes."""
    symbols = SYM.pack(0, 0, 0, 0, 0, 0) + SYM.pack(1, 0x12, 0, 0, 0, 0) * n
    return build(
        {".dynstr": b"\0" + b"_Z" * (length // 2) + b"\0", ".dynsym": symbols},
        [(".dynstr", 3, 0, 0, ".dynstr"), (".dynsym", elf.SHT_DYNSYM, 2, 0, ".dynsym")],
    )


def counted(data: bytes) -> list[elf.Work]:
    """Every reader over ``data`` with no limit on its work; what each did."""
    works = []
    for read in READERS:
        work = elf.Work(len(data), limit=None)
        try:
            read(data, work)
        except (elf.ElfError, struct.error, ValueError, IndexError):
            pass
        works.append(work)
    return works


SHAPES = st.one_of(
    st.builds(shared_versions, st.integers(1, 3000)),
    st.builds(shared_definitions, st.integers(1, 3000)),
    st.builds(
        repeated_tables,
        st.sampled_from([elf.SHT_DYNSYM, elf.SHT_DYNAMIC, 0]),
        st.integers(1, 200),
        st.integers(1, 2000),
    ),
    st.builds(one_long_name, st.integers(1, 3000), st.integers(2, 8000)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(SHAPES)
def test_the_work_of_every_reader_is_linear_in_the_file(data: bytes) -> None:
    for work in counted(data):
        assert work.records <= len(data) // 8
        assert work.name_bytes <= len(data)


def well_formed() -> bytes:
    dynstr = b"\0libc.so.6\0GLIBC_2.34\0GLIBC_2.2.5\0_ZNSs4_Rep\0"
    verneed = struct.pack("<HHIII", 1, 2, 1, 16, 0) + struct.pack("<IHHII", 0, 0, 2, 11, 16)
    verneed += struct.pack("<IHHII", 0, 0, 3, 22, 0)
    verdef = struct.pack("<HHHHIII", 1, 0, 1, 1, 0, 20, 0) + struct.pack("<II", 22, 0)
    dynsym = SYM.pack(0, 0, 0, 0, 0, 0) + SYM.pack(34, 0x12, 0, 0, 0, 0)
    dynamic = struct.pack("<qQ", elf.DT_NEEDED, 1) + bytes(16)
    return build(
        {
            ".dynstr": dynstr,
            ".gnu.version_r": verneed,
            ".gnu.version_d": verdef,
            ".dynsym": dynsym,
            ".dynamic": dynamic,
        },
        [
            (".dynstr", 3, 0, 0, ".dynstr"),
            (".gnu.version_r", elf.SHT_GNU_VERNEED, 2, 1, ".gnu.version_r"),
            (".gnu.version_d", elf.SHT_GNU_VERDEF, 2, 1, ".gnu.version_d"),
            (".dynsym", elf.SHT_DYNSYM, 2, 0, ".dynsym"),
            (".dynamic", elf.SHT_DYNAMIC, 2, 0, ".dynamic"),
        ],
    )


def test_a_well_formed_file_is_read() -> None:
    data = well_formed()
    assert elf.read_needed_versions(data, elf.Work(len(data))) == {"libc.so.6": {"GLIBC_2.34", "GLIBC_2.2.5"}}
    assert elf.read_defined_versions(data, elf.Work(len(data))) == {"GLIBC_2.2.5"}
    assert elf.read_undefined_dynamic_symbols(data, elf.Work(len(data))) == ["_ZNSs4_Rep"]
    assert elf.read_needed_libraries(data, elf.Work(len(data))) == ["libc.so.6"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=12))
def test_any_damage_to_a_file_is_read_or_refused_in_linear_work(changes: list[tuple[int, int]]) -> None:
    data = bytearray(well_formed())
    for at, value in changes:
        data[at % len(data)] = value
    for read in READERS:
        work = elf.Work(len(data), limit=None)
        try:
            read(bytes(data), work)
        except elf.ElfError:
            pass
        assert work.records <= len(data) // 8


@pytest.mark.parametrize(
    ("data", "read", "says"),
    [
        (shared_versions(50), elf.read_needed_versions, "overlap or a chain loops"),
        (repeated_tables(elf.SHT_DYNSYM, 2, 10), elf.read_undefined_dynamic_symbols, "overlap"),
        (repeated_tables(elf.SHT_DYNAMIC, 2, 10), elf.read_needed_libraries, "overlap"),
        (repeated_tables(0, 2, 10), elf.read_fatbin_archs, "overlap"),
    ],
    ids=["shared version chain", "two symbol tables", "two dynamic tables", "two fatbins"],
)
def test_shared_records_and_overlapping_sections_are_refused(data: bytes, read, says: str) -> None:
    with pytest.raises(elf.ElfError, match=says):
        read(data, elf.Work(len(data)))


def test_definitions_that_share_their_name_record_are_read() -> None:
    data = shared_definitions(2)
    assert elf.read_defined_versions(data, elf.Work(len(data))) == {"GLIBC_2.34"}


def test_a_definition_chain_that_runs_into_its_records_is_refused() -> None:
    """vd_next lands on an aux record already read as a definition's: refused, not read twice."""
    defs = struct.pack("<HHHHIII", 1, 0, 1, 1, 0, 20, 20) + struct.pack("<II", 11, 0) + bytes(12)
    data = build(
        {".dynstr": DYNSTR, ".gnu.version_d": defs},
        [(".dynstr", 3, 0, 0, ".dynstr"), (".gnu.version_d", elf.SHT_GNU_VERDEF, 2, 0, ".gnu.version_d")],
    )
    with pytest.raises(elf.ElfError, match="overlap or a chain loops"):
        elf.read_defined_versions(data, elf.Work(len(data)))


def test_one_table_under_one_header_is_read() -> None:
    data = repeated_tables(elf.SHT_DYNAMIC, 1, 10)
    assert elf.read_needed_libraries(data, elf.Work(len(data))) == ["libc.so.6"] * 10
    data = repeated_tables(0, 1, 3)
    assert elf.read_fatbin_archs(data, elf.Work(len(data))) == ({"80"}, set())


def test_a_next_that_points_back_into_its_own_chain_is_refused() -> None:
    """vn_next is unsigned, but 2**32 - 16 added to an offset wraps nowhere: it lies outside."""
    entries = struct.pack("<HHIII", 1, 1, 1, 16, 16) + struct.pack("<IHHII", 0, 0, 2, 11, 0)
    data = build(
        {".dynstr": DYNSTR, ".gnu.version_r": entries + struct.pack("<HHIII", 1, 1, 1, 0xFFFFFFF0, 0)},
        [(".dynstr", 3, 0, 0, ".dynstr"), (".gnu.version_r", elf.SHT_GNU_VERNEED, 2, 0, ".gnu.version_r")],
    )
    with pytest.raises(elf.ElfError):
        elf.read_needed_versions(data, elf.Work(len(data)))


def test_names_that_cost_more_than_the_file_allows_are_refused() -> None:
    """Each symbol names the next offset inside one long name: every name is distinct, and
    together they are the long name's length squared over two."""
    length = 4096
    symbols = SYM.pack(0, 0, 0, 0, 0, 0) + b"".join(SYM.pack(1 + i, 0x12, 0, 0, 0, 0) for i in range(length))
    data = build(
        {".dynstr": b"\0" + b"x" * length + b"\0", ".dynsym": symbols},
        [(".dynstr", 3, 0, 0, ".dynstr"), (".dynsym", elf.SHT_DYNSYM, 2, 0, ".dynsym")],
    )
    with pytest.raises(elf.ElfError, match="more work than its size allows"):
        elf.read_undefined_dynamic_symbols(data, elf.Work(len(data)))


def test_the_path_readers_refuse_a_shared_chain_as_one_error(tmp_path: Path) -> None:
    so = tmp_path / "lib.so"
    so.write_bytes(shared_versions(2000))
    with pytest.raises(elf.ElfError, match="overlap"):
        elf.needed_versions(so)


def test_the_machine_is_read_from_the_header() -> None:
    assert elf.machine_of(well_formed()[:20]) == elf.ARCH_MACHINES["x86_64"]
    big = bytearray(well_formed()[:20])
    big[4], big[5] = 2, 2
    struct.pack_into(">H", big, 18, elf.EM_S390)
    assert elf.machine_of(bytes(big)) == elf.ARCH_MACHINES["s390x"]
    with pytest.raises(elf.ElfError):
        elf.machine_of(b"\x7fELF")

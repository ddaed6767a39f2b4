"""The ELF reader's symbol versions (`.gnu.version_r` and `.gnu.version_d`) on crafted bytes.

A small ELF built here holds the version sections a linker writes; every hostile variant must
end in ElfError, never a hang, an IndexError or a name read from outside its string table.
The reader on real compiled extensions is tested in tests/builder/test_builder_verify.py.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from fa_images.builder import elf, verify

SHDR = struct.Struct("<IIQQQQIIQQ")


class Strings:
    def __init__(self) -> None:
        self.data = b"\0"

    def add(self, text: str) -> int:
        at = len(self.data)
        self.data += text.encode() + b"\0"
        return at


def verneed(dynstr: Strings, needs: dict[str, list[str]]) -> bytes:
    out = b""
    for i, (library, versions) in enumerate(needs.items()):
        aux = b""
        for j, version in enumerate(versions):
            nxt = 16 if j + 1 < len(versions) else 0
            aux += struct.pack("<IHHII", 0, 0, 2 + j, dynstr.add(version), nxt)
        nxt = 16 + len(aux) if i + 1 < len(needs) else 0
        out += struct.pack("<HHIII", 1, len(versions), dynstr.add(library), 16, nxt) + aux
    return out


def verdef(dynstr: Strings, names: list[str]) -> bytes:
    out = b""
    for i, name in enumerate(names):
        nxt = 28 if i + 1 < len(names) else 0
        out += struct.pack("<HHHHIII", 1, 0, i + 1, 1, 0, 20, nxt) + struct.pack("<II", dynstr.add(name), 0)
    return out


def make_elf(
    needs: dict[str, list[str]] | None = None,
    defines: list[str] | None = None,
    *,
    patch=None,
    dynstr_type: int = 3,
    link: int = 2,
) -> bytes:
    """An ELF64 LE file with .dynstr, .gnu.version_r and .gnu.version_d; ``patch(sections)`` may
    change the raw section bodies (a dict name -> bytearray) before they are laid out."""
    dynstr = Strings()
    bodies = {
        ".gnu.version_r": bytearray(verneed(dynstr, needs or {})),
        ".gnu.version_d": bytearray(verdef(dynstr, defines or [])),
    }
    bodies[".dynstr"] = bytearray(dynstr.data)
    if patch:
        patch(bodies)
    names = Strings()
    layout = [
        (".shstrtab", 3, 0),
        (".dynstr", dynstr_type, 0),
        (".gnu.version_r", elf.SHT_GNU_VERNEED, link),
        (".gnu.version_d", elf.SHT_GNU_VERDEF, link),
    ]
    name_at = {name: names.add(name) for name, _t, _l in layout}
    body_of = {".shstrtab": bytearray(names.data), **bodies}
    data = bytearray(64)
    offsets = {}
    for name, _t, _l in layout:
        offsets[name] = len(data)
        data += body_of[name]
    shoff = len(data)
    data += bytes(SHDR.size)  # the null section
    for name, stype, slink in layout:
        data += SHDR.pack(name_at[name], stype, 0, 0, offsets[name], len(body_of[name]), slink, 0, 1, 0)
    data[0:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", data, 0x28, shoff)
    struct.pack_into("<HHH", data, 0x3A, SHDR.size, len(layout) + 1, 1)
    return bytes(data)


NEEDS = {
    "libc.so.6": ["GLIBC_2.2.5", "GLIBC_2.34", "GLIBC_2.14"],
    "libstdc++.so.6": ["GLIBCXX_3.4.9", "CXXABI_1.3", "GLIBCXX_3.4.30", "GLIBCXX_3.4.21"],
    "libm.so.6": ["GLIBC_2.29"],
}


def write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "lib.so"
    path.write_bytes(data)
    return path


def test_needed_and_defined_versions_of_a_well_formed_file(tmp_path: Path) -> None:
    so = write(tmp_path, make_elf(NEEDS, ["libx.so.1", "GLIBCXX_3.4", "GLIBCXX_3.4.32"]))
    assert elf.needed_versions(so) == {lib: set(v) for lib, v in NEEDS.items()}
    assert verify.glibc_floor(so) == ("GLIBC_2.34", "GLIBCXX_3.4.30")  # 3.4.30 > 3.4.21 > 3.4.9
    assert elf.highest(elf.defined_versions(so), "GLIBCXX") == "GLIBCXX_3.4.32"


def test_a_file_with_empty_version_sections_has_no_floor(tmp_path: Path) -> None:
    so = write(tmp_path, make_elf())
    assert elf.needed_versions(so) == {} and verify.glibc_floor(so) == (None, None)
    assert elf.defined_versions(so) == set()


def _set(section: str, offset: int, fmt: str, value: int):
    def patch(bodies: dict[str, bytearray]) -> None:
        struct.pack_into(fmt, bodies[section], offset, value)

    return patch


def _cut(section: str, keep: int):
    def patch(bodies: dict[str, bytearray]) -> None:
        del bodies[section][keep:]

    return patch


def _unterminated(bodies: dict[str, bytearray]) -> None:
    bodies[".dynstr"][:] = bodies[".dynstr"].replace(b"\0", b"A")


ONE = {"libc.so.6": ["GLIBC_2.34", "GLIBC_2.2.5"]}
# (what is wrong, make_elf arguments): each must be refused with ElfError
HOSTILE = [
    ("vn_next past the section", dict(needs=ONE, patch=_set(".gnu.version_r", 12, "<I", 1 << 31))),
    ("vn_aux past the section", dict(needs=ONE, patch=_set(".gnu.version_r", 8, "<I", 4096))),
    ("vna_next past the section", dict(needs=ONE, patch=_set(".gnu.version_r", 28, "<I", 0xFFFFFFF0))),
    ("a library name outside .dynstr", dict(needs=ONE, patch=_set(".gnu.version_r", 4, "<I", 10**6))),
    ("a version name outside .dynstr", dict(needs=ONE, patch=_set(".gnu.version_r", 24, "<I", 10**6))),
    ("names without a NUL", dict(needs=ONE, patch=_unterminated)),
    ("a section cut short", dict(needs=ONE, patch=_cut(".gnu.version_r", 20))),
    ("a string table that takes no room", dict(needs=ONE, dynstr_type=elf.SHT_NOBITS)),
    ("a link to no section", dict(needs=ONE, link=99)),
    ("vd_aux past the section", dict(defines=["GLIBCXX_3.4"], patch=_set(".gnu.version_d", 12, "<I", 4096))),
    ("vd_next past the section", dict(defines=["GLIBCXX_3.4"], patch=_set(".gnu.version_d", 16, "<I", 1 << 30))),
]


@pytest.mark.parametrize(("what", "kwargs"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_version_sections_are_refused(tmp_path: Path, what: str, kwargs: dict) -> None:
    so = write(tmp_path, make_elf(**kwargs))
    read = elf.defined_versions if "defines" in kwargs else elf.needed_versions
    with pytest.raises(elf.ElfError):
        read(so)


def test_a_chain_that_loops_ends(tmp_path: Path) -> None:
    """vn_cnt says more records than the chain holds; a zero next ends it where it is."""
    so = write(tmp_path, make_elf({"libc.so.6": ["GLIBC_2.34"]}, patch=_set(".gnu.version_r", 2, "<H", 3)))
    assert elf.needed_versions(so) == {"libc.so.6": {"GLIBC_2.34"}}


@pytest.mark.parametrize(
    ("versions", "prefix", "highest"),
    [
        (["GLIBC_2.9", "GLIBC_2.17", "GLIBC_2.2.5"], "GLIBC", "GLIBC_2.17"),
        (["GLIBCXX_3.4.9", "GLIBCXX_3.4.30", "GLIBCXX_3.4"], "GLIBCXX", "GLIBCXX_3.4.30"),
        (["GLIBC_PRIVATE", "GLIBC_2.3"], "GLIBC", "GLIBC_2.3"),
        (["GLIBCXX_3.4.30"], "GLIBC", None),
        ([], "GLIBC", None),
    ],
)
def test_highest_version(versions: list[str], prefix: str, highest: str | None) -> None:
    assert elf.highest(versions, prefix) == highest


# (floor, host, status): an extension loads where the host's glibc and libstdc++ are as new as its floor
FLOORS = [
    (("GLIBC_2.34", "GLIBCXX_3.4.30"), ("GLIBC_2.35", "GLIBCXX_3.4.30"), "pass"),
    (("GLIBC_2.35", "GLIBCXX_3.4.29"), ("GLIBC_2.34", "GLIBCXX_3.4.30"), "fail"),  # RHEL 9's glibc 2.34
    (("GLIBC_2.28", "GLIBCXX_3.4.32"), ("GLIBC_2.39", "GLIBCXX_3.4.30"), "fail"),
    (("GLIBC_2.28", None), (None, None), "pass"),  # a host that is not glibc, or unknown: nothing to compare
    ((None, None), ("GLIBC_2.35", "GLIBCXX_3.4.30"), "pass"),
]


@pytest.mark.parametrize(("floor", "host", "status"), FLOORS)
def test_floor_against_a_host(floor, host, status: str) -> None:
    got, detail = verify.floor_findings(floor[0], floor[1], host)
    assert got == status
    assert ("cannot load here" in detail) == (status == "fail")


def test_this_host_is_read() -> None:
    glibc, glibcxx = verify.host_glibc(), verify.host_glibcxx()
    assert glibc is None or elf.version_key(glibc) >= (2, 17)
    assert glibcxx is None or elf.version_key(glibcxx) >= (3, 4, 19)

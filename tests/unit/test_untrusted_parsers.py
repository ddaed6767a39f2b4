"""Property tests for every parser of untrusted bytes: any input ends in a result or a clean error.

A clean error is the parser's own refusal (a ValueError such as ``UntrustedInput`` or
``ElfError``, a ``UsageError``); a TypeError, KeyError, RecursionError or a hang is a bug. Each
test runs under an alarm, so an input that makes a reader loop fails instead of hanging.
"""

from __future__ import annotations

import io
import json
import signal
import struct
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from packaging.utils import parse_wheel_filename

from fa_images.builder import dist, elf, generations, simple_index, verify, wheelfile
from fa_images.errors import UsageError

PAGE = "https://pypi.example/simple/flash-attn/"
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(autouse=True)
def _bounded_time() -> Iterator[None]:
    def expire(_signum: int, _frame: object) -> None:
        raise TimeoutError("a parser did not finish in 30 s: it loops or reads without bound")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(30)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.sampled_from(["2.8.3", "3.11", "0" * 64, "flash_attn-2.8.3-cp311-cp311-linux_x86_64.whl", "../x", "file:///x"])
)
_KEYS = st.sampled_from(
    ["schema_version", "wheels", "wheel", "sha256", "size", "flash_attn", "python", "archs", "files", "url"]
    + ["filename", "hashes", "versions", "yanked", "cxx11_abi", "ptx", "inputs", "entry"]
) | st.text(max_size=8)
JSON = st.recursive(
    _SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=5), max_leaves=25
)


# --- the manifest ---------------------------------------------------------------------------


def _read_manifest(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / dist.MANIFEST).write_bytes(raw)
        try:
            manifest = dist.read_manifest(Path(tmp))
        except UsageError as exc:
            assert str(exc)
        else:
            for name, record in manifest.wheels.items():
                dist.check_wheel_name(name, where="test")
                assert isinstance(record.sha256, str) and isinstance(record.size, int)


@FAST
@given(doc=JSON)
def test_any_json_manifest_reads_or_is_refused(doc: object) -> None:
    _read_manifest(json.dumps(doc).encode())


@FAST
@given(
    doc=st.fixed_dictionaries(
        {"schema_version": st.just(1), "wheels": st.dictionaries(st.text(max_size=60), JSON, max_size=3)}
    )
)
def test_any_manifest_of_the_right_outline_reads_or_is_refused(doc: object) -> None:
    _read_manifest(json.dumps(doc).encode())


@FAST
@given(raw=st.binary(max_size=300))
def test_any_bytes_as_a_manifest_read_or_are_refused(raw: bytes) -> None:
    _read_manifest(raw)


# --- an index page --------------------------------------------------------------------------


def _parse(body: bytes, content_type: str) -> None:
    try:
        page = simple_index.parse(body, content_type, url=PAGE)
    except ValueError as exc:
        assert str(exc)
    else:
        for f in page.files:
            assert isinstance(f.filename, str) and f.url.startswith("https://")
            assert f.sha256 is None or isinstance(f.sha256, str)
        assert all(isinstance(v, str) for v in page.versions)


_FILES = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "filename": _SCALARS,
            "url": _SCALARS | st.sampled_from(["x.tar.gz", "http://[::1/x", "//h/x", "https://h:99999/x"]),
            "hashes": JSON,
            "yanked": _SCALARS,
        },
    ),
    max_size=4,
)


@FAST
@given(files=_FILES, versions=JSON)
def test_any_json_index_page_parses_or_is_refused(files: list, versions: object) -> None:
    _parse(json.dumps({"files": files, "versions": versions}).encode(), "application/vnd.pypi.simple.v1+json")


@FAST
@given(doc=JSON)
def test_any_json_document_as_an_index_page_parses_or_is_refused(doc: object) -> None:
    _parse(json.dumps(doc).encode(), "application/json")


_HREF = st.text(max_size=30) | st.sampled_from(["file:///etc/passwd", "http://[::1", "x.tar.gz#sha256=ab", "//e/x"])


@FAST
@given(anchors=st.lists(st.tuples(_HREF, st.text(max_size=20)), max_size=4), noise=st.text(max_size=40))
def test_any_html_index_page_parses_or_is_refused(anchors: list[tuple[str, str]], noise: str) -> None:
    body = noise + "".join(f'<a href="{href}">{text}</a>' for href, text in anchors)
    _parse(body.encode("utf-8", "surrogatepass"), "text/html")


@FAST
@given(raw=st.binary(max_size=300), content_type=st.sampled_from(["", "text/html", "application/json"]))
def test_any_bytes_as_an_index_page_parse_or_are_refused(raw: bytes, content_type: str) -> None:
    _parse(raw, content_type)


# --- a wheel's name and METADATA ------------------------------------------------------------

_NAME_PARTS = st.sampled_from(["flash_attn", "torch", "flash-attn", "2.8.3", "2.8.3+cu128", "cp311", "linux_x86_64"])


@FAST
@given(name=st.text(max_size=80) | st.lists(_NAME_PARTS | st.text(max_size=6), max_size=6).map("-".join))
def test_any_wheel_name_is_a_flash_attn_wheel_or_refused(name: str) -> None:
    name = name if name.endswith(".whl") or not name else name + ".whl"
    try:
        dist.check_wheel_name(name, where="test")
    except UsageError as exc:
        assert str(exc)
    else:
        assert name.isprintable() and not set(name) & set(" ;$`'\"|&<>()\\/\n")


@FAST
@given(metadata=st.binary(max_size=400) | st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_any_metadata_is_a_finding_not_a_crash(metadata: bytes) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("flash_attn-2.8.3.dist-info/METADATA", metadata)
    report = verify.WheelReport(wheel="w.whl")
    with zipfile.ZipFile(buffer) as zf:
        name, version, _build, tags = parse_wheel_filename("flash_attn-2.8.3-cp311-cp311-linux_x86_64.whl")
        info = "flash_attn-2.8.3.dist-info"
        verify._check_metadata(
            report, wheelfile.Wheel(Path("w.whl"), name, version, tags, zf, info, zf.namelist()), generations.FA2
        )
    assert [c.name for c in report.checks] == ["metadata"]
    assert all(line.isprintable() for line in report.lines())


# --- the ELF and fatbin readers -------------------------------------------------------------


def _elf(shnum: int, shstrndx: int, sections: bytes, tail: bytes) -> bytes:
    head = bytearray(b"\x7fELF\x02\x01\x01" + b"\0" * 57)
    head[0x28:0x30] = (64).to_bytes(8, "little")
    head[0x3A:0x40] = (64).to_bytes(2, "little") + shnum.to_bytes(2, "little") + shstrndx.to_bytes(2, "little")
    return bytes(head) + sections + tail


_SECTION = st.builds(
    lambda name, kind, offset, size, link, entsize: struct.pack(
        "<IIQQQQIIQQ", name, kind, 0, 0, offset, size, link, 0, 0, entsize
    ),
    st.integers(0, 64),
    st.sampled_from([0, 1, 3, elf.SHT_DYNSYM, elf.SHT_NOBITS]),
    st.integers(0, 600),
    st.integers(0, 600),
    st.integers(0, 5),
    st.sampled_from([0, 1, 24, 64]),
)
ELVES = st.binary(max_size=200) | st.builds(
    lambda sections, idx, tail: _elf(len(sections), idx, b"".join(sections), tail),
    st.lists(_SECTION, max_size=5),
    st.integers(0, 6),
    st.binary(max_size=300),
)


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(data=ELVES)
def test_any_bytes_as_a_shared_library_read_or_are_refused(data: bytes, tmp_path: Path) -> None:
    so = tmp_path / "x.so"
    so.write_bytes(data)
    for read in (elf.undefined_dynamic_symbols, elf.fatbin_archs):
        try:
            read(so)
        except elf.ElfError as exc:
            assert isinstance(exc, ValueError)


_FAT_ENTRY = st.builds(
    lambda kind, header, payload, arch: (
        struct.pack("<HHIQ", kind, 1, header, payload) + b"\0" * 12 + arch.to_bytes(4, "little")
    ),
    st.sampled_from([elf.FATBIN_KIND_PTX, elf.FATBIN_KIND_CUBIN, 7]),
    st.integers(0, 80),
    st.integers(0, 1 << 40) | st.integers(0, 64),
    st.integers(0, 200),
)
FATBINS = st.lists(
    st.builds(
        lambda header, size, entries, pad: (
            struct.pack("<IHHQ", elf.FATBIN_MAGIC, 1, header, size) + b"".join(entries) + pad
        ),
        st.integers(0, 40),
        st.integers(0, 400) | st.integers(0, 1 << 62),
        st.lists(_FAT_ENTRY, max_size=3),
        st.binary(max_size=9),
    ),
    max_size=4,
).map(b"".join) | st.binary(max_size=300)


@FAST
@given(data=FATBINS)
def test_any_fatbin_ends_in_archs_or_an_error(data: bytes) -> None:
    try:
        cubins, ptx = elf.read_fatbins(data, [(0, len(data))])
    except elf.ElfError:
        return
    assert all(a.isdigit() for a in cubins | ptx)


# --- a server that does not speak HTTP ------------------------------------------------------


@pytest.fixture
def not_http() -> Iterator[str]:
    """A TCP server that answers every request with a line that is no HTTP status line."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def answer() -> None:
        while True:
            try:
                conn, _addr = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(b"garbage\r\n\r\n")

    threading.Thread(target=answer, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}/"
    listener.close()


def test_every_reader_of_an_index_takes_a_non_http_answer_as_its_own_error(not_http: str) -> None:
    """untrusted.open_url turns http.client's BadStatusLine (no OSError) into a URLError, so the
    sdist's index, compat refresh and a published dist/ each say it their way, not in a traceback."""
    import urllib.error

    from fa_images.builder import published, source, untrusted
    from fa_images.builder.errors import SourceError
    from fa_images.config import compatgen

    with pytest.raises(urllib.error.URLError, match="not an HTTP answer"):
        untrusted.fetch(not_http)
    with pytest.raises(SourceError, match="cannot read"):
        source.find_on_index("2.8.3", not_http)
    with pytest.raises(compatgen.IndexUnreachable, match="not an HTTP answer"):
        compatgen.http_fetch(not_http, {})
    with pytest.raises(SourceError, match="not an HTTP answer"):
        published.PublishedIndex.read(not_http)

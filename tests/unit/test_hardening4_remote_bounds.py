"""Class 1: a remote answer is bounded in time from its first byte, headers included, and in
size after decompression.

A socket timeout starts again at each byte, so a server that sends its status line and then a
header byte every 0.1 s kept every reader waiting past every limit: untrusted.open_url bounds
the whole request, connect through headers (redirects included), by one deadline. And a
wheel's METADATA read by HTTP range requests is inflated to at most the bound PEP 658's
``.metadata`` file has, from ranges no larger than asked. Real servers on 127.0.0.1 throughout.
"""

from __future__ import annotations

import http.server
import io
import socket
import threading
import time
import tracemalloc
import urllib.error
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from fixtures.small_compat import TABLE

from fa_images.builder import published, source, untrusted
from fa_images.builder.errors import SourceError
from fa_images.cli import main
from fa_images.config import compatgen

DEADLINE = 0.5  # seconds: the module constants are set to it, so a test ends in a few
TICK = 0.1  # a trickling server's pause between bytes: far under any socket timeout
# No assertion here reads the clock against a threshold: a loaded machine stretches every wait. A
# reader without one deadline over the whole answer never ends on a trickling server (the hang
# guard of _ends_in_time catches it); the error names the deadline that ended it; and the redirects
# are counted, not timed.
HOPS = 10  # the redirects urllib follows before it calls the chain a loop


@pytest.fixture(autouse=True)
def _short_deadlines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(untrusted, "URL_TIMEOUT", DEADLINE)
    monkeypatch.setattr(compatgen, "TIMEOUT", DEADLINE)


# --- servers that answer too slowly, a byte at a time ---------------------------------------


def _trickle_headers(conn: socket.socket, stop: threading.Event) -> None:
    """The status line at once, then one header byte every TICK, never ending the headers."""
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    while not stop.wait(TICK):
        conn.sendall(b"X")


def _trickle_status(conn: socket.socket, stop: threading.Event) -> None:
    """The status line itself one byte every TICK, then header bytes the same way."""
    for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"y" * 1000:
        if stop.wait(TICK):
            return
        conn.sendall(bytes([byte]))


def _silent(conn: socket.socket, stop: threading.Event) -> None:
    """Accepts, reads the request, says nothing."""
    stop.wait(30)


BEHAVIOURS: dict[str, Callable[[socket.socket, threading.Event], None]] = {
    "a header byte every 0.1 s": _trickle_headers,
    "a status-line byte every 0.1 s": _trickle_status,
    "nothing at all": _silent,
}


@pytest.fixture
def slow_server() -> Iterator[Callable[[str], str]]:
    """start(behaviour) -> the base URL of a TCP server answering every request that way."""
    stop = threading.Event()
    listeners: list[socket.socket] = []

    def start(behaviour: str) -> str:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listeners.append(listener)

        def one(conn: socket.socket) -> None:
            with conn:
                try:
                    conn.recv(65536)
                    BEHAVIOURS[behaviour](conn, stop)
                except OSError:  # the client gave up: what the test wants
                    pass

        def accept() -> None:
            while True:
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                threading.Thread(target=one, args=(conn,), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
        return f"http://127.0.0.1:{listener.getsockname()[1]}"

    yield start
    stop.set()
    for listener in listeners:
        listener.close()


class _RedirectServer(http.server.ThreadingHTTPServer):
    hops = 0  # the requests it answered


class _SlowRedirects(http.server.BaseHTTPRequestHandler):
    """Each hop answers after 0.2 s (well inside a socket timeout) with a redirect to the next."""

    server: _RedirectServer

    def do_GET(self) -> None:
        self.server.hops += 1
        time.sleep(2 * TICK)
        hop = int(self.path.rstrip("/").rpartition("/")[2] or 0) if self.path.startswith("/hop/") else 0
        self.send_response(302)
        self.send_header("Location", f"/hop/{hop + 1}/")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def redirect_server() -> Iterator[_RedirectServer]:
    server = _RedirectServer(("127.0.0.1", 0), _SlowRedirects)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def _ends_in_time(call: Callable[[], object]) -> BaseException | None:
    """What ``call`` raised, if anything; a call still waiting after 4 deadlines fails the test
    (it is left to its daemon thread: today's code waits on such a server forever)."""
    caught: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            caught.append(None)
        except BaseException as exc:  # handed back to the test
            caught.append(exc)

    started = time.monotonic()
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(4 * DEADLINE + 2)
    took = time.monotonic() - started
    assert caught, f"still waiting after {took:.1f} s, with a deadline of {DEADLINE} s"
    return caught[0]


# (the reader, given the server's base URL and a directory; what it raises)
READERS: dict[str, tuple[Callable[[str, Path], object], type[BaseException]]] = {
    "untrusted.fetch": (lambda base, _: untrusted.fetch(f"{base}/simple/"), urllib.error.URLError),
    "compat refresh's fetch": (lambda base, _: compatgen.http_fetch(f"{base}/torch/", {}), compatgen.IndexUnreachable),
    "the sdist's index": (lambda base, _: source.find_on_index("2.8.3", f"{base}/simple"), SourceError),
    "the sdist's download": (lambda base, tmp: source.download(f"{base}/f.tar.gz", tmp / "f", "0" * 64), SourceError),
    "build --published's index": (lambda base, _: published.PublishedIndex.read(f"{base}/"), SourceError),
}


@pytest.mark.parametrize("behaviour", sorted(BEHAVIOURS))
@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_gives_up_on_a_slow_answer_at_its_deadline(
    reader: str, behaviour: str, slow_server: Callable[[str], str], tmp_path: Path
) -> None:
    call, raised = READERS[reader]
    base = slow_server(behaviour)
    exc = _ends_in_time(lambda: call(base, tmp_path))
    assert isinstance(exc, raised), repr(exc)
    assert f"within {DEADLINE:g} s" in str(exc), str(exc)


def test_one_deadline_covers_every_redirect(redirect_server: _RedirectServer) -> None:
    """Hops of 0.2 s each, without end: each inside a socket timeout, together past the deadline.
    A deadline per hop would follow all the hops urllib allows; one deadline for the whole fetch
    gives up after two or three, and half of them is a generous bound."""
    url = f"http://127.0.0.1:{redirect_server.server_address[1]}/hop/0/"
    exc = _ends_in_time(lambda: untrusted.fetch(url))
    assert isinstance(exc, urllib.error.URLError) and not isinstance(exc, urllib.error.HTTPError), repr(exc)
    assert f"within {DEADLINE:g} s" in str(exc)
    assert 1 <= redirect_server.hops <= HOPS // 2, redirect_server.hops


COMMANDS: dict[str, tuple[Callable[[str, Path], list[str]], int]] = {
    "compat refresh --pypi": (
        lambda base, tmp: ["compat", "refresh", "--table", str(tmp / "table.yaml"), "--pypi", f"{base}/simple"],
        2,
    ),
    "build --published": (lambda base, tmp: ["build", "--matrix", "matrix.yaml", "--published", f"{base}/"], 4),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_command_on_a_slow_index_is_one_error_line_in_time(
    command: str, slow_server: Callable[[str], str], tiny_matrix, tmp_path: Path, capsys, monkeypatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")  # an engine is never asked
    (tmp_path / "table.yaml").write_text(TABLE)  # beside the matrix's own compat.yaml
    args, code = COMMANDS[command]
    base = slow_server("a header byte every 0.1 s")
    codes: list[int] = []
    exc = _ends_in_time(lambda: codes.append(main(args(base, tmp_path))))
    assert exc is None, repr(exc)
    got, err = codes[0], capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert got == code and len(errors) == 1 and "Traceback" not in err, err
    assert f"within {DEADLINE:g} s" in errors[0], errors[0]


# --- a wheel's METADATA by range requests: bounded after decompression ------------------------


class _Ranged(http.server.BaseHTTPRequestHandler):
    """Serves ``files`` by path, with HTTP Range (a suffix or start-end) unless ``ignore_range``."""

    files: ClassVar[dict[str, bytes]] = {}
    ignore_range: ClassVar[bool] = False
    asked: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        body = self.files.get(self.path)
        if body is None:
            self.send_error(404)
            return
        ranged = None if self.ignore_range else self.headers.get("Range")
        self.asked.append(ranged or "")
        if ranged:
            start, _, end = ranged.removeprefix("bytes=").partition("-")
            body = body[-int(end) :] if start == "" else body[int(start) : int(end) + 1]
        self.send_response(206 if ranged else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def wheel_server() -> Iterator[Callable[[bytes], str]]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ranged)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"

    def serve(wheel: bytes, *, ignore_range: bool = False) -> str:
        _Ranged.files, _Ranged.ignore_range, _Ranged.asked = {"/torch.whl": wheel}, ignore_range, []
        return f"{base}/torch.whl"

    yield serve
    server.shutdown()
    server.server_close()


def _wheel(metadata: bytes, *, method: int = zipfile.ZIP_DEFLATED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as zf:
        zf.writestr("torch/__init__.py", "")
        zf.writestr("torch-2.9.1.dist-info/METADATA", metadata)
    return buf.getvalue()


def _bomb(inflated: int) -> bytes:
    """A wheel whose METADATA is ``inflated`` bytes of 'A': a few kB deflated per MiB."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("torch/__init__.py", "")
        with zf.open("torch-2.9.1.dist-info/METADATA", "w") as member:
            for _ in range(inflated >> 20):
                member.write(b"A" * (1 << 20))
    return buf.getvalue()


def test_the_bomb_builder_makes_a_wheel_zipfile_reads() -> None:
    """The test's own bomb is a real zip (so a refusal below is the bound, not a broken file)."""
    with zipfile.ZipFile(io.BytesIO(_bomb(8 << 20))) as zf:
        info = zf.getinfo("torch-2.9.1.dist-info/METADATA")
        assert info.file_size == 8 << 20 and info.compress_size < 64 << 10


# (the wheel, served how, what the refusal says; the memory the read may take at most)
RANGE_CASES: dict[str, tuple[Callable[[], bytes], bool, str]] = {
    "METADATA deflated from 64 MiB": (lambda: _bomb(64 << 20), False, "more than 4 MiB of METADATA"),
    "METADATA stored, 5 MiB": (
        lambda: _wheel(b"x" * (5 << 20), method=zipfile.ZIP_STORED),
        False,
        "at most 4194304",
    ),
    "a server that ignores Range": (lambda: _wheel(b"Metadata-Version: 2.1\n" * 4000), True, "Range"),
}


@pytest.mark.parametrize("case", sorted(RANGE_CASES))
def test_metadata_read_by_ranges_is_bounded_after_inflating(case: str, wheel_server: Callable[..., str]) -> None:
    make, ignore_range, said = RANGE_CASES[case]
    url = wheel_server(make(), ignore_range=ignore_range)
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=said):
            compatgen.metadata_by_range(compatgen.http_fetch, url)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, f"the read took {peak >> 20} MiB"


def test_a_wheel_with_a_small_metadata_is_still_read_by_ranges(wheel_server: Callable[..., str]) -> None:
    text = "Metadata-Version: 2.1\nRequires-Dist: nvidia-cuda-runtime-cu12==12.8.90\n"
    url = wheel_server(_wheel(text.encode()))
    assert compatgen.metadata_by_range(compatgen.http_fetch, url) == text
    assert all(asked.startswith("bytes=") for asked in _Ranged.asked)

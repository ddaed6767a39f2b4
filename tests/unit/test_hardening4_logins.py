"""Class 3: a login in a URL (``https://user:token@host/...``) goes to its server as HTTP Basic
auth, and reaches no output: console, error, note, ``--json``, file written.

Every reader of a user-given URL (compat refresh's --pypi and --torch-index, the sdist's
--index-url, a published index) sends it through untrusted.url_request, and every URL it shows
goes through untrusted.shown_url. A real index on 127.0.0.1 answers only with the login.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from fixtures.small_compat import TABLE

from fa_images.builder import dist as dist_dir
from fa_images.builder import published, source, untrusted
from fa_images.builder.errors import SourceError
from fa_images.cli import main
from fa_images.config import compatgen
from fa_images.errors import EXIT_TABLE_CHANGED
from fa_images.run import current

USER, TOKEN = "fa-bot", "tok-S3CRET-42"
LOGIN = f"{USER}:{TOKEN}"
BASIC = "Basic " + base64.b64encode(LOGIN.encode()).decode()
# Whatever form a leak would take: the token, the login, the header's value.
SECRETS = (TOKEN, LOGIN, BASIC.split()[1], urllib.parse.quote(TOKEN))

WHEEL = "torch-2.9.1-cp312-cp312-manylinux_2_28_x86_64.whl"
METADATA = b"Metadata-Version: 2.1\nName: torch\nRequires-Dist: nvidia-cuda-runtime-cu12==12.8.90\n"
FA_SHA = "740a5370f406cbe16155cc6d078ec543a97a137501f32cba89198295e6b80e54"
ROUTES = {
    "/simple/torch/": json.dumps(
        {
            "meta": {"api-version": "1.1"},
            "files": [
                {
                    "filename": WHEEL,
                    "url": f"../../files/{WHEEL}",  # relative: the same host, so the login goes with it
                    "hashes": {"sha256": "0" * 64},
                    "core-metadata": {"sha256": hashlib.sha256(METADATA).hexdigest()},
                }
            ],
            "versions": ["2.9.1"],
        }
    ).encode(),
    f"/files/{WHEEL}.metadata": METADATA,
    "/simple/flash-attn/": json.dumps(
        {"files": [{"filename": "flash_attn-2.8.2.tar.gz", "url": "x.tar.gz", "hashes": {"sha256": FA_SHA}}]}
    ).encode(),
    "/whl/torch/": b'<a href="torch-2.9.1%2Bcu128-cp312-cp312-manylinux_2_28_x86_64.whl">x</a>\n',
    "/redirect/same/": b"",  # answered by a redirect (below)
}


class _LoginIndex(http.server.BaseHTTPRequestHandler):
    """ROUTES, to a request that carries the login; 401 to one without; 503 under /down/."""

    asked: ClassVar[list[tuple[str, str | None]]] = []
    elsewhere: ClassVar[str] = ""  # where /redirect/away/ points: another host

    def do_GET(self) -> None:
        self.asked.append((self.path, self.headers.get("Authorization")))
        if self.headers.get("Authorization") != BASIC:
            self.send_error(401)
        elif self.path.startswith("/down/"):
            self.send_error(503)
        elif self.path.startswith("/redirect/"):
            where = self.elsewhere if self.path == "/redirect/away/" else "/simple/torch/"
            self.send_response(302)
            self.send_header("Location", where)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path in ROUTES:
            body = ROUTES[self.path]
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.pypi.simple.v1+json" if body[:1] == b"{" else "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_error(404)

    def log_message(self, *args: object) -> None:
        pass


class _Anyone(http.server.BaseHTTPRequestHandler):
    """Another host: records what reached it, answers 200 to all."""

    asked: ClassVar[list[tuple[str, str | None]]] = []

    def do_GET(self) -> None:
        self.asked.append((self.path, self.headers.get("Authorization")))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


def _serve(handler: type) -> tuple[http.server.ThreadingHTTPServer, int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server, server.server_address[1]


@pytest.fixture
def index() -> Iterator[str]:
    """The index's base URL, with the login in it."""
    server, port = _serve(_LoginIndex)
    other, other_port = _serve(_Anyone)
    _LoginIndex.asked, _Anyone.asked = [], []
    _LoginIndex.elsewhere = f"http://127.0.0.1:{other_port}/simple/torch/"
    yield f"http://{LOGIN}@127.0.0.1:{port}"
    for each in (server, other):
        each.shutdown()
        each.server_close()


def _closed_port() -> int:
    server, port = _serve(_Anyone)
    server.shutdown()
    server.server_close()
    return port


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text, f"{secret!r} shown in:\n{text}"


def assert_every_request_carried_the_login() -> None:
    assert _LoginIndex.asked, "the index was never asked"
    assert all(auth == BASIC for _, auth in _LoginIndex.asked), _LoginIndex.asked


# --- compat refresh: --pypi and --torch-index with a login ---------------------------------

# (--pypi's path, --torch-index's path, the exit code, what stderr or the notes say)
REFRESHES: dict[str, tuple[str, str, int, str]] = {
    "both indexes answer": ("/simple", "/whl", EXIT_TABLE_CHANGED, ""),
    "--pypi has no such page": ("/nothing-here", "/whl", 2, "error: cannot refresh from http://***@127.0.0.1"),
    "--pypi is down": ("/down", "/whl", 2, "HTTP 503"),
    "--pypi refuses the connection": ("CLOSED/simple", "/whl", 2, "error: cannot refresh from http://***@127.0.0.1"),
    "--torch-index has no such page": ("/simple", "/nothing-here", EXIT_TABLE_CHANGED, "torch index not reached"),
    "--torch-index is down": ("/simple", "/down", EXIT_TABLE_CHANGED, "torch index not reached"),
}


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("case", sorted(REFRESHES))
def test_compat_refresh_sends_the_login_and_shows_it_nowhere(
    case: str, as_json: bool, index: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pypi, torch, code, said = REFRESHES[case]
    table, out = tmp_path / "compat.yaml", tmp_path / "new.yaml"
    table.write_text(TABLE)
    closed = f"http://{LOGIN}@127.0.0.1:{_closed_port()}"
    urls = [
        closed + path.removeprefix("CLOSED") if path.startswith("CLOSED") else index + path for path in (pypi, torch)
    ]
    args = ["compat", "refresh", "--table", table, "--out", out, "--pypi", urls[0], "--torch-index", urls[1]]
    got = main([str(a) for a in args] + (["--json"] if as_json else []))
    stdout, stderr = capsys.readouterr()
    assert got == code, stderr
    assert said in stdout + stderr, stdout + stderr
    assert_no_secret(stdout, stderr, out.read_text() if out.exists() else "")
    if as_json and code != 2:
        assert_no_secret(json.dumps(json.loads(stdout)["notes"]))
    if not pypi.startswith("CLOSED"):
        assert_every_request_carried_the_login()
    if code == EXIT_TABLE_CHANGED:
        assert (f"/files/{WHEEL}.metadata", BASIC) in _LoginIndex.asked  # a link of the page: the same login


# --- the sdist's index (--index-url) and the readers underneath -----------------------------

# (what is called, given the index's base URL with its login and a directory; what it raises)
READERS: dict[str, tuple[Callable[[str, Path], object], type[BaseException] | None]] = {
    "an sdist not on the index": (lambda base, _: source.find_on_index("9.9.9", f"{base}/simple"), SourceError),
    "an index that is down": (lambda base, _: source.find_on_index("2.8.3", f"{base}/down"), SourceError),
    "a download that is not there": (
        lambda base, tmp: source.download(f"{base}/no.tar.gz", tmp / "x", "0" * 64),
        SourceError,
    ),
    "a fetch": (lambda base, _: untrusted.fetch(f"{base}/simple/torch/"), None),
    "a fetch redirected on its host": (lambda base, _: untrusted.fetch(f"{base}/redirect/same/"), None),
    "compat refresh's fetch of a missing page": (
        lambda base, _: compatgen.http_fetch(f"{base}/nothing/", {}),
        FileNotFoundError,
    ),
    "compat refresh's fetch of a page that is down": (
        lambda base, _: compatgen.http_fetch(f"{base}/down/", {}),
        compatgen.IndexUnreachable,
    ),
    "a link off the page's host": (
        lambda base, _: untrusted.link(f"{base}/simple/torch/", "ftp://127.0.0.1/x.whl"),
        untrusted.UntrustedInput,
    ),
}


@pytest.mark.parametrize("case", sorted(READERS))
def test_every_reader_sends_the_login_and_never_says_it(case: str, index: str, tmp_path: Path) -> None:
    call, raised = READERS[case]
    if raised is None:
        call(index, tmp_path)
        assert_every_request_carried_the_login()
        return
    with pytest.raises(raised) as caught:
        call(index, tmp_path)
    assert_no_secret(str(caught.value), repr(caught.value))
    assert "***@127.0.0.1" in str(caught.value)
    if _LoginIndex.asked:
        assert_every_request_carried_the_login()


def test_a_redirect_to_another_host_does_not_carry_the_login(index: str) -> None:
    untrusted.fetch(f"{index}/redirect/away/")
    assert _LoginIndex.asked == [("/redirect/away/", BASIC)]
    assert _Anyone.asked == [("/simple/torch/", None)]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"https://{LOGIN}@pypi.example/simple", "https://***@pypi.example/simple"),
        (f"https://{TOKEN}@[::1]:8443/simple/", "https://***@[::1]:8443/simple/"),
        (f"http://{USER}:{urllib.parse.quote(TOKEN + '/@', safe='')}@h.example/", "http://***@h.example/"),
        ("https://pypi.org/simple/", "https://pypi.org/simple/"),
        (f"https://{LOGIN}@[::1/simple", "<a malformed URL with a login>"),
        (f"http://{LOGIN}@h.example/\x1b[2J", "http://***@h.example/\\x1b[2J"),
    ],
)
def test_a_url_as_shown_has_no_login(url: str, shown: str) -> None:
    assert untrusted.shown_url(url) == shown
    assert_no_secret(untrusted.shown_url(url))


def test_the_login_is_sent_percent_decoded_as_pip_sends_it() -> None:
    request = untrusted.url_request(f"https://{USER}:{urllib.parse.quote('a/b@c', safe='')}@h.example/simple/")
    assert request.full_url == "https://h.example/simple/"
    assert request.get_header("Authorization") == "Basic " + base64.b64encode(f"{USER}:a/b@c".encode()).decode()


# --- a published index: a link that holds a login is not served -----------------------------


def test_a_published_link_with_a_login_is_not_served_nor_shown(tmp_path: Path, capsys) -> None:
    """A published index is read, and links, without a login (grammar.public_url): a page link
    holding one would reach the console, the plan and the next site's page, so it serves nothing."""
    name = "flash_attn-2.8.3+cu128torch2.9cxx11abitrue-cp312-cp312-linux_x86_64.whl"
    record = dist_dir.WheelRecord.from_dict(
        {"sha256": "a" * 64, "size": 1, "flash_attn": "2.8.3", "python": "3.12", "entry": "e1"}, where="test"
    )
    site = tmp_path / "site"
    dist_dir.write_site(
        site,
        dist_dir.Manifest({name: record}),
        hrefs={name: f"https://{LOGIN}@assets.example/{name}"},
        metadata={name: None},
    )
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(site))
    )
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        place, notes = current.published(url)
        index, _ = published.PublishedIndex.read(url)
    finally:
        server.shutdown()
        server.server_close()
    assert index.manifest.wheels.keys() == {name} and index.files == {}  # recorded, not served
    assert place.wheel("e1", None) is None and notes == []
    assert_no_secret(place.where, *notes, capsys.readouterr().err)

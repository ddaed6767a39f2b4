"""The one way fa-images reads bytes it did not make: files, URLs, index links, JSON, and text it shows.

A wheel, a manifest, an sdist or an index page can come from anyone. So every read here is
bounded: regular files only (a FIFO or ``/dev/zero`` behind a symlink would be read forever),
a size cap, a time cap for URLs; a link on an index page stays on the page's scheme and host;
JSON of the wrong shape, too deep, or with a 5,000-digit number is a clean error. Everything
refused is an ``UntrustedInput`` (a ValueError), which callers turn into their own error and
exit code. Text from such input is shown through ``shown()``, so it cannot drive the terminal.

Stdlib only, Python 3.9: this module travels into every build context.
"""

from __future__ import annotations

import errno
import http.client
import io
import json
import os
import stat
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, BinaryIO

MIB = 1 << 20
# An index project page: PyPI's torch page is ~4 MB of JSON; nothing needs more than this.
MAX_PAGE = 64 * MIB
MAX_MANIFEST = 16 * MIB
URL_TIMEOUT = 60.0  # per socket operation and, as a deadline, for the whole read
_CHUNK = MIB


class UntrustedInput(ValueError):
    """A file, page or value that fa-images refuses to read further; the message says why."""


# --- files ----------------------------------------------------------------------------------


def open_regular(
    path: Path | str, *, what: str = "file", dir_fd: int | None = None, follow_symlinks: bool = True
) -> BinaryIO:
    """``path`` opened for reading, if it is a regular file (after symlinks): never a FIFO,
    a device or a directory. O_NONBLOCK keeps the open itself from waiting on a FIFO.

    ``dir_fd`` opens ``path`` relative to an open directory, and ``follow_symlinks=False``
    refuses a link there (O_NOFOLLOW): how a file in a directory others can write is read."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_symlinks:
            raise UntrustedInput(f"{what} {path} is a symlink; refusing to follow it") from None
        raise UntrustedInput(f"cannot read {what} {path}: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UntrustedInput(f"{what} {path} is not a regular file ({kind_of(mode)}); refusing to read it")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_file(
    path: Path | str, *, limit: int, what: str = "file", dir_fd: int | None = None, follow_symlinks: bool = True
) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (``open_regular``'s options)."""
    with open_regular(path, what=what, dir_fd=dir_fd, follow_symlinks=follow_symlinks) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UntrustedInput(f"{what} {path} is larger than {_size(limit)}; refusing to read it")
    return data


def kind_of(mode: int) -> str:
    """What an ``lstat``/``fstat`` mode says is there, for a message: 'a symlink', 'a FIFO', 'a file'..."""
    for test, name in (
        (stat.S_ISREG, "a file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a plain file"


def _size(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= MIB else f"{limit} bytes"


# --- URLs -----------------------------------------------------------------------------------


def split_url(url: str) -> urllib.parse.SplitResult:
    """urlsplit that turns a malformed URL (an unbalanced IPv6 literal, a bad port) into UntrustedInput."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018  (raises on a port that is not a number)
    except ValueError as exc:
        raise UntrustedInput(f"{_clip(url)} is not a valid URL: {exc}") from None
    return parts


def read_response(response: Any, *, url: str, limit: int = MAX_PAGE, timeout: float = URL_TIMEOUT) -> bytes:
    """An HTTP body of at most ``limit`` bytes, read before ``timeout`` seconds pass."""
    buffer = io.BytesIO()
    copy_response(response, buffer, url=url, limit=limit, timeout=timeout)
    return buffer.getvalue()


def copy_response(response: Any, out: BinaryIO, *, url: str, limit: int, timeout: float) -> int:
    """Copies an HTTP body into ``out``: at most ``limit`` bytes, within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    size = 0
    read = getattr(response, "read1", response.read)  # read1: one recv, so a trickle meets the deadline
    while True:
        try:
            chunk = read(_CHUNK)
        except http.client.HTTPException as exc:  # IncompleteRead, a broken chunked body
            raise urllib.error.URLError(f"{_clip(url)}: the answer broke off ({type(exc).__name__})") from None
        if not chunk:
            return size
        size += len(chunk)
        if size > limit:
            raise UntrustedInput(f"{_clip(url)} sends more than {_size(limit)}; refusing the rest")
        if time.monotonic() > deadline:
            raise UntrustedInput(f"{_clip(url)} took longer than {timeout:.0f} s to send; giving up")
        out.write(chunk)


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to http(s): never to ftp:// or anything else urllib knows."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if split_url(newurl).scheme.lower() not in ("http", "https"):
            raise UntrustedInput(f"{_clip(req.full_url)} redirects to {_clip(newurl)}; only http(s) is followed")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_OPENER = urllib.request.build_opener(_HttpOnlyRedirects)


def open_url(request: urllib.request.Request | str, *, timeout: float = URL_TIMEOUT) -> Any:
    """urlopen with a socket timeout, http(s) redirects only. A server that does not speak HTTP
    (http.client's BadStatusLine, not an OSError) is a URLError, as a refused connection is."""
    split_url(request.full_url if isinstance(request, urllib.request.Request) else request)
    try:
        return _OPENER.open(request, timeout=timeout)
    except http.client.HTTPException as exc:
        raise urllib.error.URLError(f"not an HTTP answer ({type(exc).__name__})") from None


def fetch(
    url: str, headers: dict[str, str] | None = None, *, limit: int = MAX_PAGE, timeout: float = URL_TIMEOUT
) -> tuple[bytes, str]:
    """(body, Content-Type) of a URL, bounded in size and time. HTTP and URL errors propagate."""
    request = urllib.request.Request(url, headers={"User-Agent": "fa-images", **(headers or {})})
    with open_url(request, timeout=timeout) as response:
        body = read_response(response, url=url, limit=limit, timeout=timeout)
        return body, response.headers.get("Content-Type", "") or ""


def link(page_url: str, href: str) -> str:
    """The absolute URL of a link on an index page, if it stays where the page is.

    A plain relative URL always does. An absolute one (or ``//host/...``) must keep the page's
    scheme and host, with one exception: an https link from a web page, which is how PyPI serves
    its files (pypi.org links to files.pythonhosted.org). So never ``file:``, ``ftp:`` or a
    downgrade to http from a web page. Every download is checked against a sha256 anyway, and a
    token in the page URL is never sent to another host."""
    page, target = split_url(page_url), split_url(href)
    if target.scheme or target.netloc:
        scheme, page_scheme = (target.scheme or page.scheme).lower(), page.scheme.lower()
        same_host = _host(target) == _host(page) if target.netloc else True
        allowed = (scheme == page_scheme and same_host) or (page_scheme in ("http", "https") and scheme == "https")
        if not allowed:
            shown = urllib.parse.urlunsplit(page._replace(netloc=page.netloc.rpartition("@")[2]))
            raise UntrustedInput(f"{_clip(shown)} links to {_clip(href)}, off its own scheme and host; refused")
    joined = urllib.parse.urljoin(page_url, href)
    split_url(joined)
    return joined


def _host(parts: urllib.parse.SplitResult) -> tuple[str, int | None]:
    return (parts.hostname or "").lower(), parts.port


# --- JSON -----------------------------------------------------------------------------------


def parse_json(data: bytes, *, what: str) -> Any:
    """JSON from untrusted bytes: not UTF-8, malformed, too deep, or a number past Python's
    digit limit is one UntrustedInput."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UntrustedInput(f"{what} is not UTF-8 (byte {exc.start})") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise UntrustedInput(f"{what} nests too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and int() past sys.get_int_max_str_digits
        raise UntrustedInput(f"{what} is not valid JSON: {_clip(str(exc))}") from None


def decode_text(data: bytes, *, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UntrustedInput(f"{what} is not UTF-8 (byte {exc.start})") from None


# --- showing it -----------------------------------------------------------------------------


def shown(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with every control character escaped (ESC, CR, BEL...): safe to print to a terminal."""
    if text.isprintable():
        return text
    out = []
    for char in text:
        if char.isprintable() or (keep_newlines and char == "\n"):
            out.append(char)
        else:
            out.append(repr(char)[1:-1] if len(repr(char)) > 3 else f"\\x{ord(char):02x}")
    return "".join(out)


def _clip(text: str, length: int = 120) -> str:
    text = shown(text)
    return text if len(text) <= length else text[:length] + "…"

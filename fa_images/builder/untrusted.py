"""The one way fa-images reads bytes it did not make: files, URLs, index links, JSON, and text it shows.

A wheel, a manifest, an sdist or an index page can come from anyone. So every read here is
bounded: regular files only (a FIFO or ``/dev/zero`` behind a symlink would be read forever),
a size cap, a time cap for URLs; a link on an index page stays on the page's scheme and host;
JSON of the wrong shape, too deep, or with a 5,000-digit number is a clean error. Everything
refused is an ``UntrustedInput`` (a ValueError), which callers turn into their own error and
exit code. Text from such input is shown through ``shown()``, so it cannot drive the terminal,
and a URL through ``shown_url()``, so its login (``user:token@``) never reaches any output: the
login goes to the server as HTTP Basic auth (``url_request()``), never in the URL it is sent to.

Stdlib only, Python 3.9: this module travels into every build context.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import functools
import http.client
import io
import ipaddress
import json
import os
import re
import socket
import stat
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

MIB = 1 << 20
# An index project page: PyPI's torch page is ~4 MB of JSON; nothing needs more than this.
MAX_PAGE = 64 * MIB
MAX_MANIFEST = 16 * MIB
# A deadline from a request's start through its headers (open_url), and one for its body (read_response).
URL_TIMEOUT = 60.0
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
        raise UntrustedInput(f"{_clip(shown_url(url))} is not a valid URL: {exc}") from None
    return parts


_LOGIN_WITHOUT_SLASHES = re.compile(r"^[^/@\s]*@")


def is_loopback(host: str) -> bool:
    """A host name (no port) of this machine: localhost, 127.0.0.0/8 or ::1. pip counts them a
    secure origin without TLS, and Docker Engine an insecure registry by default."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def shown_url(url: str) -> str:
    """``url`` as fa-images shows it anywhere (console, error, note, JSON, file): its login
    (``user:token@``) as ``***@``, its control characters escaped."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:  # a malformed host: where its login ends is anyone's guess
        return "<a malformed URL with a login>" if "@" in url else shown(url)
    _login, at, host = parts.netloc.rpartition("@")
    if not at:  # a login written without '//' (``user:token@host/simple``) is a login all the same
        return shown(_LOGIN_WITHOUT_SLASHES.sub("***@", url, count=1))
    # Everything after the login as written: hostname would drop IPv6 brackets, and is None for "u@/x".
    return shown(urllib.parse.urlunsplit(parts._replace(netloc="***@" + host)))


def url_request(url: str, headers: Mapping[str, str] | None = None) -> urllib.request.Request:
    """A GET of ``url`` as fa-images sends it: its login, if any, moved into an HTTP Basic
    ``Authorization`` header (percent-decoded, as pip sends it), out of the URL, where urllib
    would take ``user:token@host`` for a host name and every error would quote it."""
    parts = split_url(url)
    sent = {"User-Agent": "fa-images", **(headers or {})}
    if "@" in parts.netloc:
        user, password = urllib.parse.unquote(parts.username or ""), urllib.parse.unquote(parts.password or "")
        sent["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        url = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    return urllib.request.Request(url, headers=sent)


def read_response(response: Any, *, url: str, limit: int = MAX_PAGE, timeout: float | None = None) -> bytes:
    """An HTTP body of at most ``limit`` bytes, read before ``timeout`` seconds (URL_TIMEOUT) pass."""
    buffer = io.BytesIO()
    copy_response(response, buffer, url=url, limit=limit, timeout=URL_TIMEOUT if timeout is None else timeout)
    return buffer.getvalue()


def copy_response(response: Any, out: BinaryIO, *, url: str, limit: int, timeout: float) -> int:
    """Copies an HTTP body into ``out``: at most ``limit`` bytes, within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    size, where = 0, _clip(shown_url(url))
    read = getattr(response, "read1", response.read)  # read1: one recv, so a trickle meets the deadline
    while True:
        try:
            chunk = read(_CHUNK)
        except http.client.HTTPException as exc:  # IncompleteRead, a broken chunked body
            raise urllib.error.URLError(f"{where}: the answer broke off ({type(exc).__name__})") from None
        if not chunk:
            return size
        size += len(chunk)
        if size > limit:
            raise UntrustedInput(f"{where} sends more than {_size(limit)}; refusing the rest")
        if time.monotonic() > deadline:
            raise UntrustedInput(f"{where} took longer than {timeout:.0f} s to send; giving up")
        out.write(chunk)


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to http(s): never to ftp:// or anything else urllib knows; and
    the login (``url_request()``'s Authorization) only on the same scheme and host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        old, new = split_url(req.full_url), split_url(newurl)
        if new.scheme.lower() not in ("http", "https"):
            raise UntrustedInput(
                f"{_clip(shown_url(req.full_url))} redirects to {_clip(shown_url(newurl))}; only http(s) is followed"
            )
        redirected = super().redirect_request(req, fp, code, msg, headers, newurl)
        if redirected is not None and (new.scheme.lower(), _host(new)) != (old.scheme.lower(), _host(old)):
            redirected.remove_header("Authorization")
        return redirected


class _Deadline:
    """One request's deadline, from its start through its headers. A socket timeout starts again
    at each byte, so a server sending a header byte every second would never meet it: a timer
    shuts the connection's socket down when the deadline passes, which ends any read waiting on it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._at = time.monotonic() + seconds
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._passed = self._done = False
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, failed: type[BaseException] | None, *exc: object) -> None:
        with self._lock:  # after this, the timer touches nothing: the body reader has its own bound
            self._done = True
            if failed is None and self._socket is not None and not self._passed:
                with contextlib.suppress(OSError):  # each body read waits a full timeout again
                    self._socket.settimeout(self.seconds)
        self._timer.cancel()

    @property
    def cut(self) -> bool:
        """Whether the timer shut the connection down: what it read until then is no answer."""
        with self._lock:
            return self._passed

    @property
    def passed(self) -> bool:
        return self.cut or time.monotonic() >= self._at

    def left(self) -> float:
        """The seconds left, for a socket timeout (a connect is bounded by it); none left is a timeout."""
        left = self._at - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no answer within {self.seconds:g} s")
        return left

    def watch(self, sock: socket.socket) -> None:
        """The socket now in use, connected (a redirect opens another); too late is a timeout."""
        with self._lock:
            self._socket = sock
            if self._passed:
                raise TimeoutError(f"no answer within {self.seconds:g} s")

    def error(self) -> urllib.error.URLError:
        """The one error of a deadline passed; its reason names no URL, as a refused connection's does not."""
        return urllib.error.URLError(f"no complete answer (status and headers) within {self.seconds:g} s")

    def _expire(self) -> None:
        with self._lock:
            if self._done:
                return
            self._passed = True
            if self._socket is not None:
                # The plain socket's shutdown (an SSLSocket's own would drop its TLS state first);
                # one closed already has nothing to wait on.
                with contextlib.suppress(OSError):
                    socket.socket.shutdown(self._socket, socket.SHUT_RDWR)


class _Bounded(http.client.HTTPConnection):
    """A connection whose connect and TLS handshake get the request's time left as their socket
    timeout (a TLS handshake keeps to it as a deadline), and whose connected socket the
    deadline's timer may then shut down."""

    def __init__(self, *args: Any, deadline: _Deadline, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline = deadline

    def connect(self) -> None:
        self.timeout = self._deadline.left()
        super().connect()
        if self.sock is not None:
            self._deadline.watch(self.sock)


class _BoundedHTTPS(_Bounded, http.client.HTTPSConnection):
    pass


class _DeadlineHandler(urllib.request.AbstractHTTPHandler):
    """Opens each connection (the redirects' too) as a ``_Bounded`` one, under one deadline."""

    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def do_open(self, http_class: Any, req: urllib.request.Request, **kwargs: Any) -> http.client.HTTPResponse:
        bounded = _BoundedHTTPS if issubclass(http_class, http.client.HTTPSConnection) else _Bounded
        return super().do_open(functools.partial(bounded, deadline=self.deadline), req, **kwargs)


class _DeadlineHTTP(_DeadlineHandler, urllib.request.HTTPHandler):
    pass


class _DeadlineHTTPS(_DeadlineHandler, urllib.request.HTTPSHandler):
    pass


def open_url(request: urllib.request.Request | str, *, timeout: float | None = None) -> Any:
    """urlopen, http(s) redirects only, bounded by one deadline of ``timeout`` seconds (URL_TIMEOUT)
    from its start through the headers, redirects included: then a URLError. A login in the URL
    is sent as HTTP Basic auth (``url_request()``). A server that does not speak HTTP (http.client's
    BadStatusLine, not an OSError) is a URLError, as a refused connection is."""
    if isinstance(request, str) or "@" in split_url(request.full_url).netloc:
        request = _with_login_as_auth(request)
    deadline = _Deadline(URL_TIMEOUT if timeout is None else timeout)
    opener = urllib.request.build_opener(_HttpOnlyRedirects, _DeadlineHTTP(deadline), _DeadlineHTTPS(deadline))
    with deadline:
        try:
            response = opener.open(request, timeout=deadline.seconds)
        except (OSError, http.client.HTTPException) as exc:  # URLError and HTTPError are OSErrors
            if deadline.passed and not isinstance(exc, urllib.error.HTTPError):
                raise deadline.error() from None
            if isinstance(exc, http.client.HTTPException):
                raise urllib.error.URLError(f"not an HTTP answer ({type(exc).__name__})") from None
            raise
    if deadline.cut:  # http.client takes a cut-off header block as complete
        response.close()
        raise deadline.error()
    return response


def _with_login_as_auth(given: urllib.request.Request | str) -> urllib.request.Request:
    if isinstance(given, str):
        return url_request(given)
    return url_request(given.full_url, dict(given.header_items()))


def fetch(
    url: str, headers: dict[str, str] | None = None, *, limit: int = MAX_PAGE, timeout: float | None = None
) -> tuple[bytes, str]:
    """(body, Content-Type) of a URL, bounded in size and time. HTTP and URL errors propagate."""
    with open_url(url_request(url, headers), timeout=timeout) as response:
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
            raise UntrustedInput(
                f"{_clip(shown_url(page_url))} links to {_clip(shown_url(href))}, off its own scheme and host; refused"
            )
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


# A URL's login as written in any text (``https://user:token@host``): a credential on http(s), and a
# user:password anywhere (``git+ssh://git@host`` names no secret).
_LOGIN_IN_TEXT = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<login>[^/@\s'\"<>]+)@")
# A query parameter that carries a credential by what its name says: ?token=, private_token=,
# access_key=, X-Amz-Signature=, X-Amz-Credential=, sig= (SAS), password=, secret=, auth=, session=.
_SECRET_PARAMETER = re.compile(
    r"(?P<name>[?&;][^=&#\s'\"<>]*(?:token|secret|passw|credential|key|signature|sig|auth|session)[^=&#\s'\"<>]*=)"
    r"[^&#\s'\"<>]+",
    re.IGNORECASE,
)


def masked(text: str) -> str:
    """``text`` with every credential a URL in it carries replaced by ``***``: its login, and each
    query parameter whose name says it is one. What fa-images prints passes through here."""
    if "@" in text:
        text = _LOGIN_IN_TEXT.sub(
            lambda m: (
                m["scheme"]
                + ("***@" if ":" in m["login"] or not m["scheme"].lower().endswith("ssh://") else m["login"] + "@")
            ),
            text,
        )
    return _SECRET_PARAMETER.sub(lambda m: m["name"] + "***", text) if "=" in text else text


def shown(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with every control character escaped (ESC, CR, BEL...), safe to print to a terminal,
    and every credential of a URL in it masked (``masked``)."""
    text = masked(text)
    if text.isprintable():
        return text
    out = []
    for char in text:
        if char.isprintable() or (keep_newlines and char == "\n"):
            out.append(char)
        else:
            out.append(repr(char)[1:-1] if len(repr(char)) > 3 else f"\\x{ord(char):02x}")
    return "".join(out)


# A value printed whole inside an error: Podman's "committing container for step {Env:[...] ...}".
_PRINTED_VALUE = re.compile(r"\{[^{}]{80,}\}|\[[^\[\]]{80,}\]")


def error_line(text: str, limit: int = 300) -> str:
    """An engine's or a library's error as one shown line of at most about ``limit`` characters
    that keeps its cause. Go wraps an error as "doing: doing: cause", so what went wrong is at the
    end: values printed whole inside it are elided first ({…}), then, if it is still too long,
    its middle."""
    if len(text) > 16 * limit:  # bounded work for an answer of any size
        head, tail = text[: 8 * limit], text[-8 * limit :]
        # Less the word cut at each edge: a URL cut before its '@' or its '?token=' would pass
        # `masked` with a part of its secret in clear, and elisions can bring the cut into view.
        head_cut, tail_cut = re.search(r"\s\S*\Z", head), re.search(r"\s", tail)
        text = f"{head[: head_cut.start()] if head_cut else ''} … {tail[tail_cut.end() :] if tail_cut else ''}"
    line = shown(" ".join(text.split()))
    for _ in range(3):  # a value printed inside another goes first, then the one around it
        line, elided = _PRINTED_VALUE.subn(lambda m: m[0][0] + "…" + m[0][-1], line)
        if not elided:
            break
    if len(line) <= limit:
        return line
    kept_head = limit // 3
    kept_tail = max(limit - kept_head - 3, 0)
    return f"{line[:kept_head]} … {line[len(line) - kept_tail :]}"


def _clip(text: str, length: int = 120) -> str:
    text = shown(text)
    return text if len(text) <= length else text[:length] + "…"

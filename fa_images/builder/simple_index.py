"""A project page of a simple package index, in either of its two formats.

PEP 691 JSON where the index offers it; PEP 503 HTML is what every index serves, and
pypiserver, many mirrors and proxies answer HTML whatever the Accept header asks for. One
reader for both, used by the builder (flash-attn's sdists) and ``compat refresh`` (torch).
"""

from __future__ import annotations

import dataclasses
import html.parser
import urllib.parse
from dataclasses import dataclass, field

from . import untrusted

ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.1"


# (algorithm, hex digest) pairs, lowercased, as a page announces them.
Hashes = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class File:
    """One file of a project page: its name, its URL as written, its sha256 if published."""

    filename: str
    url: str
    sha256: str | None
    yanked: bool = False
    # PEP 658/714: None where the page announces no ``<url>.metadata``; else the hashes it
    # announces for that file, () for a bare ``true``.
    metadata: Hashes | None = None

    @property
    def metadata_sha256(self) -> str | None:
        return dict(self.metadata or ()).get("sha256")


@dataclass(frozen=True)
class Page:
    files: list[File]
    versions: list[str] = field(default_factory=list)  # PEP 691 lists them; PEP 503 does not

    def sdist_versions(self, project: str) -> list[str]:
        """The versions of ``project``'s sdists, in the page's order (``flash_attn-2.8.3.tar.gz``)."""
        prefix, suffix = f"{project.replace('-', '_')}-", ".tar.gz"
        names = [f.filename for f in self.files]
        return [n[len(prefix) : -len(suffix)] for n in names if n.startswith(prefix) and n.endswith(suffix)]


class _Anchors(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[dict[str, str | None], str]] = []  # (attributes, text)
        self._attrs: dict[str, str | None] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._attrs, self._text = dict(attrs), []

    def handle_data(self, data: str) -> None:
        if self._attrs is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._attrs is not None:
            self.found.append((self._attrs, "".join(self._text).strip()))
            self._attrs = None


def parse(body: bytes, content_type: str = "", *, url: str | None = None) -> Page:
    """The page, by its Content-Type, or by its first character when none is given.

    The page is untrusted: more than MAX_PAGE bytes, text that is not UTF-8, JSON too deep or of
    the wrong shape are a ValueError (``untrusted.UntrustedInput``); entries of the wrong type
    name no file and are left out. With the page's ``url``, every link is made absolute and must
    stay on the page's scheme and host (``untrusted.link``)."""
    if len(body) > untrusted.MAX_PAGE:
        raise untrusted.UntrustedInput(f"the index page is larger than {untrusted.MAX_PAGE >> 20} MiB")
    if "json" in content_type or (not content_type and body.lstrip()[:1] == b"{"):
        files, versions = _json_files(untrusted.parse_json(body, what="the index page"))
    elif b"<" not in body:
        raise ValueError(f"neither a PEP 691 JSON nor a PEP 503 HTML page (Content-Type {content_type or 'none'})")
    else:
        files, versions = _html_files(untrusted.decode_text(body, what="the index page")), []
    if url is not None:
        files = [dataclasses.replace(f, url=untrusted.link(url, f.url)) for f in files]
    return Page(files, versions)


def _json_files(data: object) -> tuple[list[File], list[str]]:
    if not isinstance(data, dict) or not isinstance(data.get("files", []), list):
        raise ValueError("a PEP 691 page must be an object with a list of files")
    files = []
    for f in data.get("files", []):
        # An entry without a name or URL names no file anyone could fetch.
        if not (isinstance(f, dict) and isinstance(f.get("filename"), str) and isinstance(f.get("url"), str)):
            continue
        hashes = f.get("hashes")
        sha = hashes.get("sha256") if isinstance(hashes, dict) else None
        # PEP 714 renamed PEP 658's key; the old one counts only where the new one is absent.
        announced = f["core-metadata"] if "core-metadata" in f else f.get("dist-info-metadata")
        metadata: Hashes | None = None
        if announced is True:
            metadata = ()
        elif isinstance(announced, dict):
            metadata = tuple(
                sorted(
                    (k.lower(), v.lower()) for k, v in announced.items() if isinstance(k, str) and isinstance(v, str)
                )
            )
        sha = sha if isinstance(sha, str) else None
        files.append(File(f["filename"], f["url"], sha, bool(f.get("yanked")), metadata))
    versions = data.get("versions", [])
    return files, [v for v in versions if isinstance(v, str)] if isinstance(versions, list) else []


def _html_files(text: str) -> list[File]:
    anchors = _Anchors()
    anchors.feed(text)
    anchors.close()
    files = []
    for attrs, link_text in anchors.found:
        url, _, fragment = (attrs.get("href") or "").partition("#")
        if not url:
            continue
        name = link_text or urllib.parse.unquote(url.rstrip("/").rpartition("/")[2])
        digest = fragment.partition("=")[2] if fragment.startswith("sha256=") else None
        files.append(File(name, url, digest, "data-yanked" in attrs, _html_metadata(attrs)))
    return files


def _html_metadata(attrs: dict[str, str | None]) -> Hashes | None:
    """PEP 658/714's anchor attribute: ``"true"`` or ``"<algorithm>=<hex>"``. A value of neither
    shape is read as pip reads it: the file is announced, with no hash."""
    key = "data-core-metadata" if "data-core-metadata" in attrs else "data-dist-info-metadata"
    if key not in attrs:
        return None
    algorithm, sep, digest = (attrs[key] or "").partition("=")
    return ((algorithm.lower(), digest.lower()),) if sep and algorithm else ()

"""A project page of a simple package index, in either of its two formats.

PEP 691 JSON where the index offers it; PEP 503 HTML is what every index serves, and
pypiserver, many mirrors and proxies answer HTML whatever the Accept header asks for. One
reader for both, used by the builder (flash-attn's sdists) and ``compat refresh`` (torch).
"""

from __future__ import annotations

import html.parser
import json
import urllib.parse
from dataclasses import dataclass, field

ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.1"


@dataclass(frozen=True)
class File:
    """One file of a project page: its name, its URL as written, its sha256 if published."""

    filename: str
    url: str
    sha256: str | None
    yanked: bool = False


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


def parse(body: bytes, content_type: str = "") -> Page:
    """The page, by its Content-Type, or by its first character when none is given.
    ValueError when it is neither format."""
    if "json" in content_type or (not content_type and body.lstrip()[:1] == b"{"):
        data = json.loads(body)
        if not isinstance(data, dict) or not isinstance(data.get("files", []), list):
            raise ValueError("a PEP 691 page must be an object with a list of files")
        files = [
            File(f["filename"], f["url"], (f.get("hashes") or {}).get("sha256"), bool(f.get("yanked")))
            for f in data.get("files", [])
            # An entry without a name or URL names no file anyone could fetch.
            if isinstance(f, dict) and isinstance(f.get("filename"), str) and isinstance(f.get("url"), str)
        ]
        return Page(files, [str(v) for v in data.get("versions", [])])
    if b"<" not in body:
        raise ValueError(f"neither a PEP 691 JSON nor a PEP 503 HTML page (Content-Type {content_type or 'none'})")
    anchors = _Anchors()
    anchors.feed(body.decode("utf-8", errors="replace"))
    files = []
    for attrs, text in anchors.found:
        url, _, fragment = (attrs.get("href") or "").partition("#")
        if not url:
            continue
        name = text or urllib.parse.unquote(url.rstrip("/").rpartition("/")[2])
        digest = fragment.partition("=")[2] if fragment.startswith("sha256=") else None
        files.append(File(name, url, digest, "data-yanked" in attrs))
    return Page(files)

"""Where an entry's results already are: a wheel and an image that an earlier run built, checked
(and pushed) from the same inputs (``context.inputs_digest``), so this run has nothing to do.

A wheel is current in a dist/ whose manifest records the entry with these inputs: this run's
``--dist`` (the file there with its sha256), or a published one (``build --published``: a dist/
served over http(s), whose project page serves the file with that sha256, or a directory). So a
CI runner that starts empty finds what earlier runs published, and builds only what is new.

The image is current when the registry serves the entry's tag at the digest that the run that
pushed it recorded (asked without pulling: the runner pulls nothing it does not build), or when
the engine holds it with these inputs in its label.
"""

from __future__ import annotations

import urllib.error
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..builder import dist as dist_dir
from ..builder import simple_index, source, untrusted
from ..builder.dist import Manifest, WheelRecord
from ..config import grammar
from ..errors import SourceError, UsageError


@dataclass(frozen=True)
class Wheel:
    """A current wheel: where it is (a path, or the URL an index serves it from) and its record."""

    location: str
    name: str
    record: WheelRecord


class Results(Protocol):
    """A dist/ that may hold an entry's current wheel."""

    @property
    def where(self) -> str:
        """The directory or URL, as the console shows it."""
        ...

    def wheel(self, entry: str, inputs: str) -> Wheel | None: ...


def _recorded(manifest: Manifest, entry: str, inputs: str) -> list[tuple[str, WheelRecord]]:
    return [(name, r) for name, r in sorted(manifest.wheels.items()) if r.entry == entry and r.inputs == inputs]


@dataclass(frozen=True)
class DistDir:
    """A dist/ directory: this run's own, or one published on a shared file system."""

    path: Path

    @property
    def where(self) -> str:
        return str(self.path)

    def wheel(self, entry: str, inputs: str) -> Wheel | None:
        # Read for each entry: this run writes to its own dist/ as it goes.
        manifest = dist_dir.read_manifest(self.path) if (self.path / dist_dir.MANIFEST).is_file() else Manifest()
        for name, record in _recorded(manifest, entry, inputs):
            file = self.path / name
            if file.is_file() and not file.is_symlink() and source.sha256_of(file) == record.sha256:
                return Wheel(str(file.resolve()), name, record)
        return None


@dataclass(frozen=True)
class PublishedIndex:
    """A dist/ served over http(s): its manifest.json and its PEP 503/691 project page, read once."""

    url: str
    manifest: Manifest
    served: dict[str, tuple[str, str | None]]  # wheel file name -> (its URL, the sha256 the page gives)

    @property
    def where(self) -> str:
        return self.url

    def wheel(self, entry: str, inputs: str) -> Wheel | None:
        for name, record in _recorded(self.manifest, entry, inputs):
            url, sha256 = self.served.get(name, ("", None))
            if sha256 == record.sha256:  # served, with the bytes the record was made of
                return Wheel(url, name, record)
        return None

    @classmethod
    def read(cls, url: str) -> tuple[PublishedIndex, list[str]]:
        """The index at ``url`` (a dist/'s root), and notes for the console. Nothing there yet is
        an empty index; an index that cannot be read is an error, not a reason to rebuild it all."""
        base = url if url.endswith("/") else url + "/"
        notes = []
        raw = _fetch(base + dist_dir.MANIFEST, url)
        manifest = Manifest() if raw is None else _parsed(raw, base + dist_dir.MANIFEST)
        if raw is None:
            notes.append(f"published: {url} has no {dist_dir.MANIFEST} yet: nothing there is current")
        page_url = f"{base}{dist_dir.SIMPLE}/{dist_dir.PROJECT}/"
        body = _fetch(page_url, url, accept=simple_index.ACCEPT) if manifest.wheels else None
        served: dict[str, tuple[str, str | None]] = {}
        if body is not None:
            try:
                page = simple_index.parse(body[0], body[1], url=page_url)
            except ValueError as exc:  # UntrustedInput included
                raise SourceError(f"--published {url}: its page {page_url} cannot be read: {exc}") from None
            served = {f.filename: (f.url, f.sha256) for f in page.files if not f.yanked}
        elif manifest.wheels:
            notes.append(f"published: {url} serves no {page_url}: none of its wheels is current")
        return cls(url, manifest, served), notes


def _fetch(url: str, published: str, *, accept: str | None = None) -> tuple[bytes, str] | None:
    """A published file's body and Content-Type; None when the server says it has none (404)."""
    try:
        return untrusted.fetch(url, {"Accept": accept} if accept else None, limit=untrusted.MAX_MANIFEST)
    except urllib.error.HTTPError as exc:
        if exc.code in (404, 410):
            return None
        raise SourceError(f"--published {published}: {url} answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:  # refused, timed out, too large, a bad redirect
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise SourceError(f"--published {published}: cannot read {url}: {untrusted.shown(str(reason))}") from None


def _parsed(raw: tuple[bytes, str], url: str) -> Manifest:
    try:
        return dist_dir.parse_manifest(raw[0], where=url)
    except UsageError as exc:
        raise SourceError(str(exc)) from None


def published(value: str) -> tuple[Results, list[str]]:
    """``build --published``: an http(s) URL of a published dist/, or a dist/ directory."""
    if value.startswith(("http://", "https://")):
        problem = grammar.index_url(value)
        if problem is None and grammar.has_credentials(value):
            problem = f"{grammar.without_credentials(value)!r} holds a login; a published index is read without one"
        if problem:
            raise UsageError(f"--published: {problem}")
        return PublishedIndex.read(value)
    path = Path(value)
    if not path.is_dir():
        raise UsageError(f"--published {untrusted.shown(value)}: not an http(s) URL or a directory")
    return DistDir(path), []

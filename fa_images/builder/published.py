"""A dist/ published over http(s) (GitHub Pages, any static server): its ``manifest.json`` and
its project page (PEP 503 HTML or PEP 691 JSON), read once, bounded, as untrusted bytes. ``build
--published`` finds what is current there; ``dist site`` adds this run's wheels to it.

Stdlib and packaging only, like the rest of ``builder/``.
"""

from __future__ import annotations

import hashlib
import urllib.error
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import quote

from packaging.utils import canonicalize_name, parse_wheel_filename

from . import dist, simple_index, untrusted, variants
from .errors import SourceError, UsageError
from .source import sha256_of


@dataclass(frozen=True)
class PublishedIndex:
    url: str  # the dist/'s root, ending in /
    manifest: dist.Manifest
    files: dict[str, simple_index.File]  # what its project page serves, by file name (yanked left out)

    @classmethod
    def read(cls, url: str) -> tuple[PublishedIndex, list[str]]:
        """The index at ``url``, and notes for the console. Nothing there yet is an empty index;
        an index that cannot be read is an error, not a reason to rebuild or republish it all."""
        base, shown = url if url.endswith("/") else url + "/", untrusted.shown_url(url)
        notes = []
        raw = _fetch(base + dist.MANIFEST, url)
        manifest = dist.Manifest() if raw is None else _parsed(raw, base + dist.MANIFEST)
        if raw is None:
            notes.append(f"published: {shown} has no {dist.MANIFEST} yet: nothing there is current")
        files: dict[str, simple_index.File] = {}
        for root, project in sorted({(dist.index_of(name), generation_project(name)) for name in manifest.wheels}):
            page_url = f"{base}{root}/{project}/"
            body = _fetch(page_url, url, accept=simple_index.ACCEPT)
            if body is None:
                page = untrusted.shown_url(page_url)
                notes.append(f"published: {shown} serves no {page}: none of its {project} wheels is current")
                continue
            files.update(_served(body, page_url, url))
        return cls(base, manifest, files), notes

    def serves(self, name: str, sha256: str) -> simple_index.File | None:
        """The page's file ``name``, if it is served with these bytes (its announced sha256)."""
        found = self.files.get(name)
        return found if found is not None and found.sha256 == sha256 else None


def generation_project(wheel_name: str) -> str:
    """The project page a wheel is served on (each generation's project); dist's records are checked names."""
    return canonicalize_name(parse_wheel_filename(wheel_name)[0])


def _served(body: tuple[bytes, str], page_url: str, url: str) -> dict[str, simple_index.File]:
    """The files a project page serves: not yanked, printable links without a login, metadata
    hashes of 64 hex digits."""
    try:
        page = simple_index.parse(body[0], body[1], url=page_url)
    except ValueError as exc:  # UntrustedInput included
        where = f"--published {untrusted.shown_url(url)}: its page {untrusted.shown_url(page_url)}"
        raise SourceError(f"{where} cannot be read: {exc}") from None
    # A link that is not printable, or holds a login, would reach the console, the report and the
    # next site's page: not served. A published index is read, and links, without one.
    files = {f.filename: f for f in page.files if not f.yanked and _showable(f.url)}
    # A metadata hash is written into the next site's HTML: 64 hex digits, or none.
    return {
        n: f if dist.SHA256.fullmatch(f.metadata_sha256 or "") else replace(f, metadata=None) for n, f in files.items()
    }


def _showable(link: str) -> bool:
    """A link the console, the report and the next site may show as it is: printable, no login."""
    return link.isprintable() and " " not in link and "@" not in untrusted.split_url(link).netloc


def _fetch(url: str, published: str, *, accept: str | None = None) -> tuple[bytes, str] | None:
    """A published file's body and Content-Type; None when the server says it has none (404)."""
    where, shown = untrusted.shown_url(published), untrusted.shown_url(url)
    try:
        return untrusted.fetch(url, {"Accept": accept} if accept else None, limit=untrusted.MAX_MANIFEST)
    except urllib.error.HTTPError as exc:
        if exc.code in (404, 410):
            return None
        raise SourceError(f"--published {where}: {shown} answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:  # refused, not HTTP, cut, too large
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise SourceError(f"--published {where}: cannot read {shown}: {untrusted.shown(str(reason))}") from None


def _parsed(raw: tuple[bytes, str], url: str) -> dist.Manifest:
    try:
        return dist.parse_manifest(raw[0], where=url)
    except UsageError as exc:
        raise SourceError(str(exc)) from None


@dataclass(frozen=True)
class Site:
    """What ``dist site`` wrote, and what must go where its links point."""

    wheels: int  # on the site's page, the published ones included
    uploads: list[Path]  # this run's new wheels and their .metadata


def site(directory: Path, out: Path, *, wheel_url: str, published: PublishedIndex | None) -> Site:
    """``out``: the published index with the wheels of the dist/ ``directory`` added, their links
    ``wheel_url`` + name (a release's assets: each wheel and its ``.metadata`` go there). A
    wheel published under the same name with other bytes is refused (exit 6)."""
    if out.resolve() == directory.resolve():
        raise UsageError(f"--out {out} is the dist/ itself; the site is written apart from it")
    new = dist.read_manifest(directory)
    if not new.wheels:
        raise UsageError(f"{directory} holds no wheels to publish (no records in its {dist.MANIFEST})")
    records: dict[str, dist.WheelRecord] = {}
    hrefs: dict[str, str] = {}
    metadata: dict[str, str | None] = {}
    for name, record in (published.manifest.wheels if published else {}).items():
        served = published.serves(name, record.sha256) if published else None
        if served is None:  # a page half-published or cached apart from its manifest: lose nothing
            where = untrusted.shown_url(published.url) if published else ""
            raise SourceError(
                f"--published {where}: its manifest records {name}, which its page does not serve with that "
                "sha256; refusing to write a site without it"
            )
        records[name], hrefs[name], metadata[name] = record, served.url, served.metadata_sha256
    uploads = []
    for name, record in sorted(new.wheels.items()):
        wheel = directory / name
        if not wheel.is_file() or wheel.is_symlink() or sha256_of(wheel) != record.sha256:
            raise UsageError(f"{wheel} is not the file {directory / dist.MANIFEST} records (sha256 {record.sha256})")
        if name in records:
            if records[name].sha256 != record.sha256:
                raise dist.WheelConflict(
                    f"{name} is published with sha256 {records[name].sha256[:16]}…, this one has "
                    f"{record.sha256[:16]}…; a published wheel is never replaced under its name"
                )
            records[name] = record  # the same bytes: this run's record (its inputs, its pushed image)
            continue
        meta = _metadata_file(directory, name)
        records[name], hrefs[name] = record, wheel_url + quote(name)
        metadata[name] = None if meta is None else hashlib.sha256(meta.read_bytes()).hexdigest()
        bundle = dist.attestations_of(directory, name, record)  # signed statements, uploaded beside it
        uploads += [wheel] + ([meta] if meta else []) + ([bundle] if bundle else [])
    manifest = dist.Manifest(records)
    twin_sha256: dict[str, str] = {}
    for twin in dist.site_twins(manifest):  # each beside its class wheel, uploaded with it
        rel = f"{variants.FOLDER}/{twin.name}"
        hrefs[rel] = hrefs[twin.source].rsplit("/", 1)[0] + "/" + quote(twin.name)
        if directory / twin.source in uploads:
            made = _twin_file(directory, twin, records[twin.source].sha256)
            twin_sha256[rel] = sha256_of(made)
            uploads.append(made)
    dist.write_site(out, manifest, hrefs=hrefs, metadata=metadata, twin_sha256=twin_sha256)
    return Site(len(records), uploads)


def _twin_file(directory: Path, twin: variants.Twin, source_sha256: str) -> Path:
    """The twin dist/ made of the class wheel with ``source_sha256`` (``dist.write_simple_index``)."""
    path = directory / variants.FOLDER / twin.name
    made_from = directory / variants.FOLDER / f"{twin.name}{dist.SOURCE_SUFFIX}"
    try:
        recorded = untrusted.read_file(made_from, limit=256, what="variant record", follow_symlinks=False)
        ok = path.is_file() and not path.is_symlink() and recorded == source_sha256.encode()
    except (OSError, untrusted.UntrustedInput):
        ok = False
    if not ok:
        raise UsageError(f"{path} is not the variant twin of {twin.source}; `fa-images dist merge` writes it")
    return path


def _metadata_file(directory: Path, name: str) -> Path | None:
    """The ``<wheel>.metadata`` dist/ wrote beside the wheel, if the wheel has METADATA; it must
    hold the wheel's own (a stale or planted one would make pip refuse the wheel)."""
    expected = dist.core_metadata(directory / name)
    if expected is None:
        return None
    path = directory / f"{name}{dist.METADATA_SUFFIX}"
    try:
        found = untrusted.read_file(path, limit=untrusted.MAX_MANIFEST, what="metadata file")
    except (OSError, untrusted.UntrustedInput) as exc:
        raise UsageError(f"{path} cannot be read ({exc}); `fa-images dist merge` writes it") from None
    if found != expected:
        raise UsageError(f"{path} is not the METADATA of {name}; `fa-images dist merge` writes it")
    return path

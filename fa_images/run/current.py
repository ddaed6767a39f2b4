"""Where an entry's results already are: a wheel and an image that an earlier run built, checked
(and pushed) from the same inputs (``context.inputs_digest``), so this run has nothing to do.

A wheel is current in a dist/ whose manifest records the entry with these inputs: this run's
``--dist`` (the file there with its sha256), or a published one (``build --published``: a dist/
served over http(s), whose project page serves the file with that sha256, or a directory). So a
CI runner that starts empty finds what earlier runs published, and builds only what is new.

The image is current when the registry serves the entry's tag at the digest that the run that
pushed it recorded (asked without pulling: the runner pulls nothing it does not build), or when
the engine holds it with these inputs in its label.

A published wheel is final: it is never replaced under its name, whatever later inputs would
compile. An entry whose wheel is published, but not current (a new fa-images, a new base), has
its image made around that wheel (``final``, fetched and verified only then): no compile,
and nothing new to publish but the image.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..builder import dist as dist_dir
from ..builder import source, untrusted
from ..builder.dist import Manifest, WheelRecord
from ..builder.published import PublishedIndex
from ..config import grammar
from ..config.model import Entry
from ..errors import UsageError


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

    def wheel(self, entry: str, inputs: str | None) -> Wheel | None:
        """The wheel recorded for ``entry`` from ``inputs`` (None: from any inputs)."""
        ...

    def fetch(self, wheel: Wheel, into: Path) -> Path:
        """``wheel`` as a file in the directory ``into``, its sha256 checked, with its record in
        a manifest beside it."""
        ...


def _recorded(manifest: Manifest, entry: str, inputs: str | None) -> list[tuple[str, WheelRecord]]:
    """The records of ``entry`` (made from ``inputs``; None: from any), by name."""
    return [
        (name, r)
        for name, r in sorted(manifest.wheels.items())
        if r.entry == entry and (inputs is None or r.inputs == inputs)
    ]


def final(place: Results, entry: str) -> Wheel | None:
    """The wheel ``place`` publishes for ``entry``, whatever inputs made it: final, never compiled
    again (an entry not current has its image made around it)."""
    return place.wheel(entry, None)


def _place(into: Path, file: Path, wheel: Wheel, *, move: bool) -> Path:
    """``file`` into the dist/ ``into``, with its record: the image's build copies the one, the
    export reads the other."""
    (placed,) = dist_dir.add_wheels(into, [dist_dir.Incoming(file, wheel.record, wheel.location)], move=move)
    return placed


@dataclass(frozen=True)
class DistDir:
    """A dist/ directory: this run's own, or one published on a shared file system."""

    path: Path

    @property
    def where(self) -> str:
        return str(self.path)

    def wheel(self, entry: str, inputs: str | None) -> Wheel | None:
        # Read for each entry: this run writes to its own dist/ as it goes.
        manifest = dist_dir.read_manifest(self.path) if (self.path / dist_dir.MANIFEST).is_file() else Manifest()
        for name, record in _recorded(manifest, entry, inputs):
            file = self.path / name
            if file.is_file() and not file.is_symlink() and source.sha256_of(file) == record.sha256:
                return Wheel(str(file.resolve()), name, record)
        return None

    def fetch(self, wheel: Wheel, into: Path) -> Path:
        return _place(into, Path(wheel.location), wheel, move=False)


@dataclass(frozen=True)
class PublishedDist:
    """A dist/ served over http(s): a wheel is current there when its project page serves it."""

    index: PublishedIndex

    @property
    def where(self) -> str:
        return untrusted.shown_url(self.index.url)

    def wheel(self, entry: str, inputs: str | None) -> Wheel | None:
        for name, record in _recorded(self.index.manifest, entry, inputs):
            served = self.index.serves(name, record.sha256)
            if served is not None:
                return Wheel(served.url, name, record)
        return None

    def fetch(self, wheel: Wheel, into: Path) -> Path:
        with tempfile.TemporaryDirectory(dir=into.parent, prefix=f".{into.name}-") as tmp:
            downloaded = source.download(wheel.location, Path(tmp) / wheel.name, wheel.record.sha256)
            return _place(into, downloaded, wheel, move=True)


def published(value: str) -> tuple[Results, list[str]]:
    """``build --published``: an http(s) URL of a published dist/, or a dist/ directory."""
    if "://" in value:  # a URL of any scheme is checked as one, its login never shown
        problem = grammar.public_url(value)
        if problem:
            raise UsageError(f"--published: {problem}")
        index, notes = PublishedIndex.read(value)
        return PublishedDist(index), notes
    path = Path(value)
    if not path.is_dir():
        raise UsageError(f"--published {untrusted.shown(value)}: not an http(s) URL or a directory")
    return DistDir(path), []


def shared_wheels(dist: Path, every: tuple[Entry, ...], selected: tuple[Entry, ...]) -> dict[str, tuple[str, Path]]:
    """For each selected entry of a compile group that shares one wheel (an abi3 one) and has no
    record of its own in ``dist``: the group's wheel, which an earlier run compiled for another entry
    of the matrix, as (that entry, its file). dist/ holds it once, so it is not compiled again."""
    if not (dist / dist_dir.MANIFEST).is_file():
        return {}
    place = DistDir(dist)
    groups: dict[str, list[str]] = {}
    for e in every:
        if e.recipe.shares_wheel():
            groups.setdefault(e.compile_group, []).append(e.id)
    found = {}
    for e in selected:
        if not e.recipe.shares_wheel() or place.wheel(e.id, None) is not None:
            continue
        for other in groups.get(e.compile_group, []):
            wheel = place.wheel(other, None) if other != e.id else None
            if wheel is not None:
                found[e.id] = (other, Path(wheel.location))
                break
    return found

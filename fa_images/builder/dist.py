"""dist/: verified wheels, their manifest and a PEP 503 simple index, owned by this module alone.

The index serves each wheel's METADATA beside it (PEP 658, ``<wheel>.metadata``), so a
resolver reads the wheel's torch pin without downloading the wheel.

``fa-images wheel`` (inside images, where only this package exists), ``fa-images build``
and ``fa-images dist merge`` all add wheels through ``add_wheels``. A wheel is copied into a
staging file in dist/ itself and renamed into place (atomic on one filesystem); then the
manifest and each index page are replaced by rename too, so a reader (pip, uv, a static
server, a concurrent merge) never sees a partial file. Every path a merge writes is checked
(``safe_io.OutputDir.check_writable``) before the first wheel moves, so a refused merge leaves
dist/ as it was; what fails later (a full disk) is undone. A wheel whose sha256 differs from
the one already recorded under its file name is refused: two different builds must not share
a name, and an installer pinned to the first sha256 would reject the second.

Stdlib and packaging only: this module travels into every build context.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import html
import json
import os
import re
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from . import generations, safe_io, scratch, settings, untrusted, variants, wheelfile
from .errors import UsageError, VerificationFailed
from .source import sha256_of

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"
SIMPLE = "simple"
SHA256 = re.compile(r"[0-9a-f]{64}")
IMAGE_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")  # an image's digest as a registry gives it
# A record's arch: a number, with "a" (sm_90a: that GPU only) or "f" (its family) where nvcc made one.
ARCH = re.compile(r"\d{2,3}[af]?", re.ASCII)
# What a wheel file name may hold at all: PEP 427's characters, nothing a shell or terminal reads.
_WHEEL_CHARS = re.compile(r"[A-Za-z0-9_.+-]+\.whl")
# A record comes from whoever made the directory merged, and its text reaches manifest.json, the
# index pages and reports: each field has the grammar of what `fa-images build` writes there.
RECORD_FIELDS = {
    "python": re.compile(r"3\.\d{1,2}", re.ASCII),
    "flash_attn": re.compile(r"\d[0-9A-Za-z.+!_-]{0,63}", re.ASCII),
    "torch": re.compile(r"\d[0-9A-Za-z.+!_-]{0,63}", re.ASCII),
    "cuda": re.compile(r"\d{2}\.\d", re.ASCII),
    "entry": re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}", re.ASCII),
    "image": re.compile(r"[a-z0-9][A-Za-z0-9_.:/@+-]{0,511}", re.ASCII),
    "sdist_sha256": SHA256,
    "inputs": SHA256,
    "attestations": SHA256,
}
# The platforms a flash-attn wheel is built for; anything else in a tag is refused.
KNOWN_PLATFORM = re.compile(r"(?:linux|manylinux(?:1|2010|2014|_2_\d{1,3}))_(?:x86_64|aarch64)", re.ASCII)


class WheelConflict(VerificationFailed):
    """A wheel's sha256 differs from the one dist/ holds under the same file name (exit 6)."""


class BuiltFor(Protocol):
    """What a wheel was built for, as both a build's settings (the builder's) and a matrix entry
    (the host's) say it: the record of either is made by ``WheelRecord.of``."""

    @property
    def flash_attn(self) -> str: ...
    @property
    def python(self) -> str: ...
    @property
    def torch(self) -> str | None: ...
    @property
    def cuda(self) -> str | None: ...
    @property
    def cxx11_abi(self) -> bool | None: ...
    @property
    def archs(self) -> Sequence[str]: ...
    @property
    def ptx(self) -> bool | None: ...


@dataclass(frozen=True)
class WheelRecord:
    """One wheel in dist/manifest.json: what it is and what it was built for."""

    sha256: str
    size: int
    flash_attn: str
    python: str
    torch: str | None = None
    cuda: str | None = None
    cxx11_abi: bool | None = None
    archs: tuple[str, ...] = ()
    ptx: bool | None = None
    entry: str | None = None  # the matrix entry id, when built by `fa-images build`
    image: str | None = None
    sdist_sha256: str | None = None
    build_seconds: float | None = None
    # The digest of everything the entry's build was made of (`fa-images build`), set once every
    # step of the entry passed: a later run with the same digest has nothing to do.
    inputs: str | None = None
    # The image's digest as the registry took it, when that run pushed: where its image is current.
    pushed: str | None = None
    # The sha256 of its signed attestations beside it (WHEEL + ATTESTATIONS_SUFFIX), when signed.
    attestations: str | None = None

    @classmethod
    def of(cls, wheel: Path, sha256: str, built_for: BuiltFor, **more: Any) -> WheelRecord:
        """The record of ``wheel`` (its size read here), built for ``built_for``; ``more``: the
        fields only its maker knows (the entry and image, the sdist, the build's time)."""
        return cls(
            sha256=sha256,
            size=wheel.stat().st_size,
            flash_attn=built_for.flash_attn,
            python=built_for.python,
            torch=built_for.torch,
            cuda=built_for.cuda,
            cxx11_abi=built_for.cxx11_abi,
            archs=tuple(built_for.archs),
            ptx=built_for.ptx,
            **more,
        )

    def to_dict(self) -> dict:
        data = asdict(self)
        data["archs"] = list(self.archs)
        return data

    def with_facts(self, other: WheelRecord) -> WheelRecord:
        """This record, with the fields it lacks taken from ``other`` (same wheel). The pushed
        digest goes with the inputs it was built from: never one run's image with another's inputs."""
        mine, theirs = self.to_dict(), other.to_dict()
        if mine["inputs"] is not None and mine["inputs"] != theirs["inputs"]:
            theirs["pushed"] = None
        return WheelRecord.from_dict(
            {k: (v if v not in (None, []) else theirs[k]) for k, v in mine.items()}, where="merge"
        )

    @classmethod
    def from_dict(cls, data: object, *, where: str) -> WheelRecord:
        if not isinstance(data, dict):
            raise UsageError(f"{where}: a wheel record must be an object, not {type(data).__name__}")
        known = {f for f in cls.__dataclass_fields__}
        missing = [k for k in ("sha256", "size", "flash_attn", "python") if data.get(k) is None]
        if missing:
            raise UsageError(f"{where}: the record lacks {', '.join(missing)}")
        sha = data["sha256"]
        if not isinstance(sha, str) or not SHA256.fullmatch(sha):
            raise UsageError(f"{where}: sha256 {sha!r} is not 64 lowercase hex digits")
        if not isinstance(data["size"], int) or isinstance(data["size"], bool) or data["size"] < 0:
            raise UsageError(f"{where}: size {data['size']!r} is not a byte count")
        archs = data.get("archs") or []
        if not isinstance(archs, list) or not all(isinstance(a, str) and ARCH.fullmatch(a) for a in archs):
            raise UsageError(f'{where}: archs {archs!r} is not a list of archs such as ["80", "90a"]')
        for key, grammar in RECORD_FIELDS.items():
            if data.get(key) is not None and not isinstance(data[key], str):
                raise UsageError(f"{where}: {key} {data[key]!r} is not a string")
            if data.get(key) is not None and not grammar.fullmatch(data[key]):
                raise UsageError(f"{where}: {key} {data[key][:80]!r} is not what fa-images records there")
        pushed = data.get("pushed")
        if pushed is not None and not (isinstance(pushed, str) and IMAGE_DIGEST.fullmatch(pushed)):
            raise UsageError(f"{where}: pushed {pushed!r} is not an image digest (sha256: and 64 hex digits)")
        for key in ("cxx11_abi", "ptx"):
            if data.get(key) is not None and not isinstance(data[key], bool):
                raise UsageError(f"{where}: {key} {data[key]!r} is not true or false")
        values = {k: v for k, v in data.items() if k in known}
        values["archs"] = tuple(archs)
        return cls(**values)


@dataclass
class Manifest:
    """dist/manifest.json: ``{"schema_version": 1, "wheels": {file name: record}}``."""

    wheels: dict[str, WheelRecord] = field(default_factory=dict)
    migrated_from: str | None = None  # the older shape it was read from, if any

    def to_json(self) -> str:
        data = {
            "schema_version": SCHEMA_VERSION,
            "wheels": {name: self.wheels[name].to_dict() for name in sorted(self.wheels)},
        }
        return json.dumps(data, indent=2, sort_keys=True) + "\n"


def check_wheel_name(name: object, *, where: str) -> None:
    """A flash-attn wheel's file name: no directory part can lead a record outside its dir, no
    control or shell characters, a platform tag from KNOWN_PLATFORM."""
    if not isinstance(name, str) or name.startswith(".") or not _WHEEL_CHARS.fullmatch(name):
        raise UsageError(f"{where}: {name!r} is not a wheel file name (letters, digits, _ . + - and .whl)")
    try:
        project, _version, _build, tags = parse_wheel_filename(name)
    except (InvalidWheelFilename, InvalidVersion) as exc:
        raise UsageError(f"{where}: {name!r} is not a wheel file name: {exc}") from None
    if generations.of_project(project) is None:
        known = " or ".join(g.project for g in generations.GENERATIONS)
        raise UsageError(f"{where}: {name!r} is a wheel of {project}, not of {known}")
    odd = sorted({t.platform for t in tags if not KNOWN_PLATFORM.fullmatch(t.platform)})
    if odd:
        raise UsageError(f"{where}: {name!r} has platform tag {odd[0]!r}, not one fa-images builds (linux x86_64)")


def read_manifest(directory: Path) -> Manifest:
    """The manifest in ``directory`` (empty if there is none); older shapes are migrated.

    Shapes read: this schema; the ``{"wheels": {...}}`` of ``fa-images build`` before it had a
    schema_version; the one-wheel ``{"wheel": NAME, "sha256": ...}`` of ``fa-images wheel``.
    """
    path = directory / MANIFEST
    if not os.path.lexists(path):
        return Manifest()
    try:
        raw = untrusted.read_file(path, limit=untrusted.MAX_MANIFEST, what="manifest")
    except untrusted.UntrustedInput as exc:
        raise UsageError(str(exc)) from None
    return parse_manifest(raw, where=str(path))


def parse_manifest(raw: bytes, *, where: str) -> Manifest:
    """A manifest's bytes, from a file or a published index (``where`` names it in errors)."""
    try:
        data = untrusted.parse_json(raw, what="it")
    except untrusted.UntrustedInput as exc:
        raise UsageError(
            f"{where} is not a JSON manifest ({exc}); move it away to start a new one (the wheels are kept)"
        ) from None
    if data == {}:
        return Manifest()
    if not isinstance(data, dict):
        raise UsageError(f"{where} is not an fa-images manifest: it holds a JSON {type(data).__name__}")
    version = data.get("schema_version")
    if version is not None and version != SCHEMA_VERSION:
        newer = isinstance(version, int) and version > SCHEMA_VERSION
        raise UsageError(
            f"{where} has schema_version {version!r}; this fa-images reads {SCHEMA_VERSION}"
            + ("; upgrade fa-images to read it" if newer else "")
        )
    if isinstance(data.get("wheels"), dict):
        records = {}
        for name, record in data["wheels"].items():
            check_wheel_name(name, where=where)
            assert isinstance(name, str)  # JSON keys are strings; check_wheel_name said so too
            records[name] = WheelRecord.from_dict(record, where=f"{where}: {name}")
        return Manifest(records, migrated_from=None if version else "fa-images build (no schema_version)")
    if version is None and isinstance(data.get("wheel"), str):
        name = data["wheel"]
        check_wheel_name(name, where=where)
        record = WheelRecord.from_dict(data, where=f"{where}: {name}")
        return Manifest({name: record}, migrated_from="fa-images wheel (one wheel, no schema_version)")
    raise UsageError(
        f"{where} is not an fa-images manifest (expected schema_version {SCHEMA_VERSION} and a 'wheels' object, "
        f"found keys {sorted(data)[:6]})"
    )


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[None]:
    """Serializes writers of one dist/ (a lock on the directory itself: no lock file to leave behind)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def check_installable(wheel: Path) -> None:
    """pip and uv refuse a wheel without RECORD; say so before it reaches dist/."""
    with untrusted.open_regular(wheel, what="wheel") as f, zipfile.ZipFile(f) as zf:
        if not any(n.endswith(".dist-info/RECORD") and n.count("/") == 1 for n in zf.namelist()):
            raise VerificationFailed(f"{wheel.name} has no .dist-info/RECORD: pip and uv would refuse to install it")


def _conflict(out: safe_io.OutputDir, name: str, new_sha: str, recorded: WheelRecord | None, source: str) -> str | None:
    """Why ``name`` with ``new_sha`` cannot enter ``out``, or None (something else under that name
    is a UsageError). A record whose file is gone is stale: deleting a wheel is how a user makes
    room for a rebuild of it."""
    directory, final = out.path, out.path / name
    kind = out.kind(name)
    if kind is None:
        return None
    if kind != "file":  # an output path of the wrong kind, as anywhere else: exit 2, not a conflict
        raise UsageError(
            f"{untrusted.shown(str(final))} is {untrusted.kind_of(os.lstat(final).st_mode)}, not a wheel; refused"
        )
    if recorded is not None and recorded.sha256 != new_sha:
        return (
            f"{name} from {source} has sha256 {new_sha[:16]}…, but {directory}/{MANIFEST} records "
            f"{recorded.sha256[:16]}… under that name; refused (delete {final} to replace it)"
        )
    if recorded is None and sha256_of(final) != new_sha:
        return f"{final} exists, unrecorded, with another sha256 than the one from {source}; refused (delete it first)"
    return None


@dataclass(frozen=True)
class Incoming:
    """A verified wheel on its way into dist/, with the record that describes it."""

    path: Path
    record: WheelRecord
    source: str  # where it came from, for messages


def add_wheels(
    directory: Path, wheels: list[Incoming], *, move: bool = False, log: Callable[[str], None] = lambda _: None
) -> list[Path]:
    """Adds verified wheels to ``directory``: all conflicts are found before anything is written,
    wheels are placed first and the manifest and index last, so a record never names a missing file.
    Callers verify first (``verify.accept_wheel``); the record's sha256 is the verifier's."""
    out = safe_io.OutputDir(directory, what="dist directory")
    with locked(directory):
        manifest = read_manifest(directory)
        if manifest.migrated_from:
            log(f"{directory}/{MANIFEST}: migrating from {manifest.migrated_from} to schema_version {SCHEMA_VERSION}")
        seen: dict[str, Incoming] = {}
        for item in wheels:
            name = item.path.name
            check_wheel_name(name, where=item.source)
            if name in seen and seen[name].record.sha256 != item.record.sha256:
                raise WheelConflict(
                    f"{name} comes with two different sha256 ({seen[name].source} and {item.source}); refused"
                )
            why = _conflict(out, name, item.record.sha256, manifest.wheels.get(name), item.source)
            if why:
                raise WheelConflict(why)
            seen[name] = item
        # Every path this run writes is checked before the first wheel moves: a refusal leaves
        # dist/ as it was, never wheels without their manifest or index.
        present = sorted(set(seen) | {n for n in manifest.wheels if out.kind(n) == "file"})
        outputs = _outputs(present)
        out.check_writable(outputs)
        # And what fails past the checks (a full disk, a race) is undone: the files it replaces
        # are kept (all small: the wheels already there are never rewritten).
        saved = _save(out, [p for p in outputs if p not in present] + _stale_pages(out, present))
        placed, new, consumed = [], [], []
        try:
            for name, item in seen.items():
                final = directory / name
                there = out.kind(name) == "file"
                if there and not _same_file(item.path, final):
                    log(f"{name}: already in {directory} with this sha256")
                    consumed.append(item.path)
                elif not there:
                    out.link_in(name, item.path) if move else out.copy_in(name, item.path)
                    new.append(name)
                    consumed.append(item.path)
                bundle = attestations_of(item.path.parent, name, item.record) if not move else None
                if bundle is not None and not _same_file(bundle, directory / bundle.name):
                    out.copy_in(bundle.name, bundle)  # signed statements travel with their wheel
                old = manifest.wheels.get(name)
                record = item.record
                if old is not None and old.sha256 == record.sha256:
                    record = record.with_facts(old)  # the same wheel again: keep what the first record knew
                manifest.wheels[name] = record
                placed.append(final)
            out.write_text(MANIFEST, manifest.to_json())
            write_simple_index(directory, manifest)
        except BaseException:
            _restore(out, saved, new)
            raise
        if move:  # only now: a change undone leaves the build's wheel where it was
            for source in consumed:
                with contextlib.suppress(FileNotFoundError):
                    source.unlink()
    return placed


# What dist/ held before a change: path -> bytes, None where nothing was; and which folders were there.
_Saved = tuple[dict[str, "bytes | None"], list[str]]


def _save(out: safe_io.OutputDir, paths: list[str]) -> _Saved:
    files = {p: out.read_bytes(p, limit=untrusted.MAX_PAGE) for p in paths}
    return files, _index_folders(out)


def _restore(out: safe_io.OutputDir, saved: _Saved, new_wheels: list[str]) -> None:
    """Puts back what ``_save`` kept and removes the wheels and folders this change added;
    best effort (the error that got here is the one reported)."""
    files, folders = saved
    for name in new_wheels:
        out.remove_file(name)
    for rel, data in files.items():
        with contextlib.suppress(OSError, UsageError):
            out.write_bytes(rel, data) if data is not None else out.remove_file(rel)
    for folder in reversed(_index_folders(out)):  # the deepest first: each only if empty
        if folder not in folders:
            out.remove_owned_dir(folder, lambda _: False)


def _class_dir(name: str) -> bool:
    return bool(settings.GPU_CLASS.fullmatch(name))


def _index_folders(out: safe_io.OutputDir) -> list[str]:
    """The index folders dist/ holds now, each before those inside it: simple/, every GPU
    class's <class>/ and <class>/simple/, and their project folders."""
    roots = [SIMPLE] + [f"{name}/{SIMPLE}" for name in out.list() if _class_dir(name) and out.kind(name) == "dir"]
    folders: list[str] = []
    for root in roots:
        if out.kind(root) != "dir":
            continue
        if root != SIMPLE:
            folders.append(root.split("/")[0])
        folders.append(root)
        folders += [f"{root}/{name}" for name in out.list(root) if out.kind(f"{root}/{name}") == "dir"]
    return folders


def _stale_pages(out: safe_io.OutputDir, present: list[str]) -> list[str]:
    """The pages the new indexes no longer have (a project, a GPU class): write_simple_index removes them."""
    keep = set(_pages(present, lambda name, _depth: name))
    pages = [f"{folder}/index.html" for folder in _index_folders(out)]
    return [page for page in pages if page not in keep and out.kind(page) == "file"]


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def set_inputs(directory: Path, entry: str, inputs: str | None, *, pushed: str | None = None) -> None:
    """Marks the wheels of ``entry`` as made of ``inputs`` (None: not known to be current), and
    its image as pushed at digest ``pushed`` (None: not pushed by the run that made it)."""
    if not (directory / MANIFEST).is_file():
        return
    out = safe_io.OutputDir(directory, create=False, what="dist directory")
    with locked(directory):
        manifest = read_manifest(directory)
        changed = {
            name: replace(record, inputs=inputs, pushed=pushed)
            for name, record in manifest.wheels.items()
            if record.entry == entry and (record.inputs, record.pushed) != (inputs, pushed)
        }
        if changed:
            manifest.wheels.update(changed)
            out.write_text(MANIFEST, manifest.to_json())


ATTESTATIONS_SUFFIX = ".intoto.jsonl"  # beside a wheel: its signed statements, one DSSE envelope a line


def set_attestations(directory: Path, wheel: str, sha256: str) -> None:
    """Records the bundle of signed statements written beside ``wheel`` (its sha256)."""
    out = safe_io.OutputDir(directory, create=False, what="dist directory")
    with locked(directory):
        manifest = read_manifest(directory)
        record = manifest.wheels.get(wheel)
        if record is not None and record.attestations != sha256:
            manifest.wheels[wheel] = replace(record, attestations=sha256)
            out.write_text(MANIFEST, manifest.to_json())


def attestations_of(directory: Path, wheel: str, record: WheelRecord) -> Path | None:
    """The bundle beside a wheel, if its record names one and it is that file (None: unsigned)."""
    if record.attestations is None:
        return None
    path = directory / (wheel + ATTESTATIONS_SUFFIX)
    if not path.is_file() or path.is_symlink() or sha256_of(path) != record.attestations:
        raise UsageError(f"{path} is not the attestation bundle {directory / MANIFEST} records for {wheel}")
    return path


def _projects(files: Iterable[str]) -> dict[str, list[str]]:
    """The index's projects and their files (paths in dist/, in order): wheels by their file
    names, variant twins and ``variants.json`` by the name that starts theirs."""
    projects: dict[str, list[str]] = {}
    for rel in sorted(files):
        base = rel.rsplit("/", 1)[-1]
        plain = not rel.startswith(f"{variants.FOLDER}/")
        project = parse_wheel_filename(base)[0] if plain else base.split("-", 1)[0]
        projects.setdefault(canonicalize_name(project), []).append(rel)
    return projects


def gpu_class(name: str) -> str | None:
    """The GPU class a wheel's file name names in its +label ('sm80'), None where it names none."""
    return settings.gpu_class_of(parse_wheel_filename(name)[1].local)


def index_of(name: str) -> str:
    """The folder of the index that lists a wheel under its own name: its GPU class's, else the one."""
    return class_index(gpu_class(name))


def class_index(cls: str | None) -> str:
    """The folder of a GPU class's index (``sm80/simple``), or the one index's for no class."""
    return f"{cls}/{SIMPLE}" if cls else SIMPLE


def indexes(names: Iterable[str]) -> dict[str, list[str]]:
    """Each index dist/ serves, as its folder, and the files it lists (paths in dist/). pip and uv
    rank local labels as text (``.sm90`` over ``.sm80``), so a GPU class's wheel is never offered
    beside another's: ``<class>/simple`` lists that class's wheels and those that name no class,
    for a node of that class; ``simple`` lists the wheels that name no class, and each class's
    wheel as its variant twin (``variants.py``), with the ``variants.json`` of their version: uv's
    wheel variants take the node's class from it, and an installer without them takes none."""
    every = sorted(names)
    named = {name: gpu_class(name) for name in every}
    twins = [t for name in every if named[name] and (t := _twin(name))]
    found = {SIMPLE: [n for n in every if named[n] is None] + twin_files(twins)}
    for cls in sorted({c for c in named.values() if c}):
        found[f"{cls}/{SIMPLE}"] = [name for name in every if named[name] in (None, cls)]
    return found


def _twin(name: str, record: WheelRecord | None = None) -> variants.Twin | None:
    """A dist/ wheel's variant twin: its name from the wheel's, its properties from its record."""
    if record is None:  # where it goes, not what it says
        return variants.twin_of(name)
    return variants.twin_of(name, archs=record.archs, ptx=bool(record.ptx), cuda=record.cuda)


def twin_files(twins: Iterable[variants.Twin]) -> list[str]:
    """The paths in dist/ of the twins and of their versions' ``variants.json``."""
    listed = list(twins)
    files = [f"{variants.FOLDER}/{t.name}" for t in listed]
    return files + sorted({f"{variants.FOLDER}/{t.index_file}" for t in listed})


@dataclass(frozen=True)
class _Page:
    """One page of an index: its title and links (href, text); ``project``: its links are wheels."""

    title: str
    links: list[tuple[str, str]]
    project: bool


def _pages(present: Iterable[str], href: Callable[[str, int], str]) -> dict[str, _Page]:
    """Every page of the indexes of ``present``, by path; a wheel's href is ``href(name, depth)``,
    depth its page's folders below the top."""
    pages: dict[str, _Page] = {}
    for root, names in indexes(present).items():
        projects = _projects(names)
        pages[f"{root}/index.html"] = _Page("Simple index", [(f"{quote(p)}/", p) for p in projects], project=False)
        depth = root.count("/") + 2
        for project, wheels in projects.items():
            links = [(href(n, depth), n) for n in wheels]
            pages[f"{root}/{project}/index.html"] = _Page(f"Links for {project}", links, project=True)
    return pages


def _outputs(present: list[str]) -> list[str]:
    """Every path of dist/ that adding wheels writes when ``present`` are its wheels afterwards:
    each wheel and its ``.metadata``, the manifest, the index pages, the variant twins."""
    paths = [p for name in present for p in (name, f"{name}{METADATA_SUFFIX}")]
    twins = [p for p in indexes(present)[SIMPLE] if p.startswith(f"{variants.FOLDER}/")]
    twins += [f"{p}{SOURCE_SUFFIX}" for p in twins if p.endswith(".whl")]
    return paths + [MANIFEST, *_pages(present, lambda name, _depth: name), *twins]


def _page(title: str, links: list[str]) -> str:
    body = "\n".join(links)
    return (
        "<!DOCTYPE html>\n<html>\n<head>\n"
        '<meta name="pypi:repository-version" content="1.0">\n'
        f"<title>{html.escape(title)}</title>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


METADATA_SUFFIX = ".metadata"


def core_metadata(wheel: Path) -> bytes | None:
    """The wheel's METADATA as pip reads it (its ``<name>-<version>.dist-info/METADATA``, through
    ``wheelfile``), or None where it has none, one that is too large, or pip would refuse the wheel."""
    try:
        with wheelfile.open_wheel(wheel) as opened:
            return opened.metadata()
    except wheelfile.BadWheel:
        return None


def _metadata_sha256(out: safe_io.OutputDir, name: str) -> str | None:
    """PEP 658/714: ``<wheel>.metadata`` written beside the wheel, so pip and uv read a wheel's
    requirements (its torch pin) without downloading the wheel; its sha256, which the link
    announces. None where the wheel has no readable METADATA."""
    data = core_metadata(out.path / name)
    if data is None:
        return None
    out.write_bytes(f"{name}{METADATA_SUFFIX}", data)
    return hashlib.sha256(data).hexdigest()


def _link(href: str, name: str, sha256: str | None, metadata_sha256: str | None) -> str:
    """One file's anchor on a project page: its sha256 where known, and its ``.metadata``'s where there is one."""
    attributes = ""
    if metadata_sha256 is not None:
        attributes = (
            f' data-dist-info-metadata="sha256={metadata_sha256}" data-core-metadata="sha256={metadata_sha256}"'
        )
    fragment = f"#sha256={sha256}" if sha256 else ""
    return f'<a href="{html.escape(href)}{fragment}"{attributes}>{html.escape(name)}</a><br>'


def _index_file(name: str) -> bool:
    """The files of an index folder that write_simple_index makes (and so may remove)."""
    return name == "index.html"


def _write_pages(
    out: safe_io.OutputDir, pages: dict[str, _Page], sha256: dict[str, str], metadata: dict[str, str | None]
) -> None:
    """Writes ``pages``: a project page links each wheel with its sha256 and its ``.metadata``'s."""
    for path, page in pages.items():
        anchors = [
            _link(href, name.rsplit("/", 1)[-1], sha256.get(name), metadata.get(name))
            if page.project
            else f'<a href="{html.escape(href)}">{html.escape(name)}</a><br>'
            for href, name in page.links
        ]
        out.write_text(path, _page(page.title, anchors))


def write_simple_index(directory: Path, manifest: Manifest) -> None:
    """dist/simple/ and each GPU class's dist/<class>/simple/ (``indexes``): PEP 503 indexes of
    the recorded wheels (hrefs relative, so file://, --find-links and any static server work).
    Each page is replaced by a rename, through safe_io: a symlinked folder is refused, and a
    stale folder loses only the page written here."""
    out = safe_io.OutputDir(directory, what="dist directory")
    present = [name for name in manifest.wheels if out.kind(name) == "file"]
    out.check_writable(_outputs(present))
    pages = _pages(present, lambda name, depth: "../" * depth + quote(name))
    metadata = {name: _metadata_sha256(out, name) for name in present}
    sha256 = {n: manifest.wheels[n].sha256 for n in present} | _write_twins(out, manifest, present)
    _write_pages(out, pages, sha256, metadata)
    kept = {path.rsplit("/", 1)[0] for path in pages} | {path.split("/")[0] for path in pages}
    for folder in reversed(_index_folders(out)):  # the deepest first
        if folder not in kept:
            out.remove_owned_dir(folder, _index_file)


SOURCE_SUFFIX = ".source"  # beside a twin: the sha256 of the class wheel it was made from


def _write_twins(out: safe_io.OutputDir, manifest: Manifest, present: list[str]) -> dict[str, str]:
    """dist/variants/: each class wheel's twin, made again only where its class wheel changed (a
    wheel deleted and rebuilt), each version's ``variants.json``, and nothing stale. The sha256
    of every file written, by its path."""
    twins = [t for name in present if (t := _twin(name, manifest.wheels[name]))]
    written: dict[str, str] = {}
    for twin in twins:
        rel, source_sha = f"{variants.FOLDER}/{twin.name}", manifest.wheels[twin.source].sha256
        made_from = out.read_bytes(f"{rel}{SOURCE_SUFFIX}", limit=256) if out.kind(rel) == "file" else None
        if made_from != source_sha.encode():
            with scratch.scratch_dir("variant") as tmp:
                variants.make(out.path / twin.source, twin, tmp / twin.name)
                out.link_in(rel, tmp / twin.name)
            out.write_bytes(f"{rel}{SOURCE_SUFFIX}", source_sha.encode())
        written[rel] = sha256_of(out.path / rel)
    for rel, data in variant_documents(twins).items():
        written[rel] = hashlib.sha256(data).hexdigest()
        out.write_bytes(rel, data)
    keep = set(written) | {f"{p}{SOURCE_SUFFIX}" for p in written}
    for name in out.list(variants.FOLDER) if out.kind(variants.FOLDER) == "dir" else []:
        if f"{variants.FOLDER}/{name}" not in keep and name.endswith((".whl", SOURCE_SUFFIX, "-variants.json")):
            out.remove_file(f"{variants.FOLDER}/{name}")
    if not written:
        out.remove_owned_dir(variants.FOLDER, lambda _: False)  # only if empty
    return written


def variant_documents(twins: Iterable[variants.Twin]) -> dict[str, bytes]:
    """Each version's ``variants.json`` (its path in dist/ or a site -> its bytes)."""
    listed = list(twins)
    documents = {}
    for index_file in sorted({t.index_file for t in listed}):
        document = variants.document(t for t in listed if t.index_file == index_file)
        documents[f"{variants.FOLDER}/{index_file}"] = (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()
    return documents


def site_twins(manifest: Manifest) -> list[variants.Twin]:
    """The variant twins of a site's class wheels (``write_site`` links each beside its wheel)."""
    return [t for name, record in sorted(manifest.wheels.items()) if (t := _twin(name, record))]


def write_site(
    directory: Path,
    manifest: Manifest,
    *,
    hrefs: dict[str, str],
    metadata: dict[str, str | None],
    twin_sha256: dict[str, str] | None = None,
) -> list[str]:
    """A published index whose wheels are served elsewhere (a release's assets, each
    ``<wheel>.metadata`` beside its wheel): ``manifest.json`` and ``simple/``, each wheel's link
    its absolute URL in ``hrefs``, its ``.metadata``'s sha256 in ``metadata`` (None: it has none);
    a class wheel's variant twin linked at its URL in ``hrefs`` (by its path, ``variants/NAME``),
    with its sha256 where ``twin_sha256`` has it, and each version's ``variants.json`` on the site.
    The paths written, every one checked before the first write."""
    out = safe_io.OutputDir(directory, what="site directory")
    pages = _pages(manifest.wheels, lambda rel, depth: hrefs[rel] if rel in hrefs else "../" * depth + quote(rel))
    documents = variant_documents(site_twins(manifest))
    paths = [MANIFEST, *pages, *documents]
    out.check_writable(paths)
    sha256 = {n: r.sha256 for n, r in manifest.wheels.items()} | (twin_sha256 or {})
    sha256 |= {rel: hashlib.sha256(data).hexdigest() for rel, data in documents.items()}
    _write_pages(out, pages, sha256, metadata)
    for rel, data in documents.items():
        out.write_bytes(rel, data)
    out.write_text(MANIFEST, manifest.to_json())
    return paths


def collect(sources: list[Path]) -> list[Incoming]:
    """Every wheel under ``sources`` with its record from the manifest beside it (CI artifacts,
    other dist/ dirs, bake outputs). A wheel without a record is refused: the record is what says
    which Python, ABI and archs it must be verified against."""
    found: list[Incoming] = []
    for source in sources:
        if not source.is_dir():
            raise UsageError(f"{source} is not a directory (give the folders that hold wheels and manifest.json)")
        for here, dirs, files in os.walk(source):
            # The indexes and the variant twins are made from the wheels beside them, not merged.
            dirs[:] = sorted(
                d for d in dirs if not d.startswith(".") and d not in (SIMPLE, variants.FOLDER) and not _class_dir(d)
            )
            folder = Path(here)
            wheels = sorted(f for f in files if f.endswith(".whl") and not f.startswith("."))
            manifest = read_manifest(folder)
            for name in wheels:
                if name not in manifest.wheels:
                    raise UsageError(
                        f"{folder / name} has no record in {folder / MANIFEST}: nothing says what to verify it "
                        "against (merge the folder written by `fa-images build` or `fa-images wheel`)"
                    )
            for name, record in manifest.wheels.items():
                if name not in wheels:
                    raise UsageError(f"{folder / MANIFEST} records {name}, which is not in {folder}")
                found.append(Incoming(folder / name, record, str(folder / MANIFEST)))
    if not found:
        raise UsageError(f"no wheels found under {', '.join(map(str, sources))}")
    return found


def verify_incoming(item: Incoming, log: Callable[[str], None]) -> None:
    """The verifier without an import (no torch needed here), against the record's own expectations."""
    from .verify import inspect_wheel

    try:
        actual = sha256_of(item.path)
    except untrusted.UntrustedInput as exc:
        raise UsageError(str(exc)) from None
    if actual != item.record.sha256:
        raise VerificationFailed(
            f"{item.path} has sha256 {actual[:16]}…, but {item.source} records {item.record.sha256[:16]}…"
        )
    size = item.path.stat().st_size
    if size != item.record.size:  # the size goes into the index pages as it is
        raise VerificationFailed(f"{item.path} is {size} bytes, but {item.source} records {item.record.size}")
    report = inspect_wheel(
        item.path,
        expect_python=item.record.python,
        expect_cxx11_abi=item.record.cxx11_abi,
        expect_archs=item.record.archs or None,
        import_check=False,
        gpus=[],  # the wheel is judged, not this host's GPUs: no nvidia-smi
    )
    for line in report.lines():
        log(line)
    if not report.ok:
        raise VerificationFailed(f"{item.path} failed verification: " + "; ".join(report.problems()))
    if _public(report.version) != _public(item.record.flash_attn):
        raise VerificationFailed(
            f"{item.path} is flash-attn {report.version}, but {item.source} records flash_attn "
            f"{item.record.flash_attn!r} for it; refused"
        )
    check_installable(item.path)


def _public(version: str | None) -> str | None:
    """'2.8.3+cu128torch2.9cxx11abitrue' -> '2.8.3'; None for no version or a malformed one."""
    try:
        return Version(version).public if version else None
    except InvalidVersion:
        return None


def merge(sources: list[Path], directory: Path, *, log: Callable[[str], None] = print) -> list[Path]:
    """``fa-images dist merge``: verify every incoming wheel, then add them all, or none."""
    incoming = collect(sources)
    for item in incoming:
        verify_incoming(item, log)
    return add_wheels(directory, incoming, log=log)

"""Refreshes the compatibility table from the package indexes, as cog's compatgen does.

What each fact comes from:
- torch releases and the Pythons each ships: PyPI's JSON simple API (PEP 691), the cpXY tags
  of its manylinux x86_64 wheels (free-threaded ``cp313t`` builds left out).
- PyPI's default CUDA variant: the wheel's own METADATA, read from PEP 658's ``.metadata``
  file where the page announces one (checked against the sha256 announced with it), or, for
  older uploads without one, from the wheel by HTTP range requests (only the
  zip directory and METADATA are fetched, not the 500 MB wheel). ``nvidia-cuda-runtime-cu12
  ==12.8.90`` means 12.8; ``cuda-toolkit[...]==13.0.2`` means 13.0.
- the CUDA variants of each release: the torch index's file list (``torch-2.9.1+cu128-...``).
  When it cannot be reached, the variants already in the table are kept, a new release gets
  its PyPI default variant only, and the refresh says so.
- torch's CUDA libraries: the ``==`` pins of ``nvidia-*`` and ``cuda-toolkit`` in the same
  METADATA, for the default variant, in the layers the torch stage installs them in before torch
  (``library_layers``); other variants keep what the table has.
- the C++ ABI: no index states it. Variants already in the table keep theirs; new ones follow
  PyTorch's published rule: new ABI from torch 2.7 on, and for 2.6.0+cu126; old before.
- flash-attn sdists and their sha256: PyPI. Versions already in the table are re-checked;
  newer ones inside ``flash_attn_range`` are added (an older one is left out on purpose: the
  table lists the versions whose setup.py shape was checked).

The result is spliced into compat.yaml between ``# BEGIN generated <section>`` and
``# END generated <section>``, so the hand-written comments and sections stay as they are.
What it changed (``TableDiff``: torch releases, their variants, Pythons and default CUDA, and
flash-attn sdists, added, removed or updated) is read from the two tables as ``plan`` reads
them, not from how the refresh got there, so CI can act on it (``compat refresh --json``).
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
import textwrap
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from ..builder import simple_index, source, untrusted
from ..builder.errors import SourceError
from ..errors import UsageError
from . import compat as compat_mod
from . import grammar, yamlfile

PYPI = "https://pypi.org/simple"
TORCH_INDEX = "https://download.pytorch.org/whl"
MIN_TORCH = "2.4.0"
TIMEOUT = 60
_CUDA_PIN = re.compile(
    r"^Requires-Dist:\s*(?:nvidia-cuda-runtime-cu\d+|cuda-toolkit(?:\[[^\]]*\])?)\s*\(?==\s*(\d+)\.(\d+)", re.M
)


class IndexUnreachable(Exception):
    """An index did not answer; the refresh goes on with what the table already knows."""


Fetch = Callable[[str, dict[str, str]], bytes]


def http_fetch(url: str, headers: dict[str, str]) -> bytes:
    """The body of ``url``, bounded in size and time (``untrusted.fetch``). Errors name the URL as
    shown (``untrusted.shown_url``): a mirror's login goes to it as Basic auth, never into a message."""
    shown = untrusted.shown_url(url)
    try:
        return untrusted.fetch(url, headers, timeout=TIMEOUT)[0]
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise FileNotFoundError(shown) from None
        raise IndexUnreachable(f"{shown}: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise IndexUnreachable(f"{shown}: {untrusted.shown(str(getattr(exc, 'reason', exc)))}") from None


@dataclass
class TorchFacts:
    version: str
    pythons: list[str]
    default_cuda: str | None
    variants: dict[str, bool] = field(default_factory=dict)  # CUDA -> cxx11_abi
    unread: str | None = None  # why the default CUDA could not be read, where it could not
    libraries: dict[str, compat_mod.Layers] = field(default_factory=dict)  # CUDA -> its library layers, where known


def _final(version: str) -> Version | None:
    try:
        parsed = Version(version)
    except InvalidVersion:
        return None
    return None if parsed.is_prerelease or parsed.is_devrelease or parsed.local else parsed


def _py(tag: str) -> str:
    return f"{tag[0]}.{tag[1:]}"


def default_cuda_of(metadata: str) -> str | None:
    """'Requires-Dist: nvidia-cuda-runtime-cu12==12.8.90' -> '12.8'; None for a CPU wheel."""
    match = _CUDA_PIN.search(metadata)
    return f"{match.group(1)}.{match.group(2)}" if match else None


def library_layers(metadata: str, python: str, apart: tuple[str, ...]) -> compat_mod.Layers:
    """torch's CUDA libraries, from its METADATA: the ``==`` pins of ``nvidia-*`` and
    ``cuda-toolkit`` that a Linux x86_64 ``python`` installs, as layers. The toolkit's own
    libraries come first, in one layer: they move only with the CUDA release. Then each library
    of ``apart`` (cudnn, nccl, ...; NVIDIA releases them on their own), a layer each, in that
    order: a torch release that moves one pin rebuilds that layer and the ones above it."""
    environment = {
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "sys_platform": "linux",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "python_version": python,
        "python_full_version": f"{python}.0",
    }
    layers: dict[str, list[str]] = {"": [], **{a: [] for a in apart}}
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        try:
            req = Requirement(line.partition(":")[2].strip())
        except InvalidRequirement:
            continue
        name, specs = canonicalize_name(req.name), list(req.specifier)
        if not (name.startswith("nvidia-") or name == "cuda-toolkit") or [s.operator for s in specs] != ["=="]:
            continue
        if req.marker is not None and not req.marker.evaluate(environment):
            continue
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        pin = f"{name}{extras}=={specs[0].version}"
        if grammar.library_pin(pin) is None:  # a pin that is not a word of the table's grammar is left out
            key = re.sub(r"-cu\d+$", "", name.removeprefix("nvidia-"))
            layers[key if key in layers else ""].append(pin)
    return tuple(tuple(sorted(pins)) for pins in layers.values() if pins)


# A wheel's METADATA is a few kB (torch's, with its long description, ~40 kB).
MAX_METADATA = 4 << 20
_TAIL = 65536  # the zip's end record is in its last 64 KiB (a comment is at most 65535 bytes)


def _range(fetch: Fetch, url: str, start: int, size: int, *, limit: int) -> bytes:
    """``size`` bytes of ``url`` from ``start`` (a negative start: the last ``size``), at most
    ``limit`` of them asked for, and no more taken: a server that ignores Range sends the wheel."""
    if not 0 < size <= limit:
        raise ValueError(f"{untrusted.shown_url(url)}: a zip record of {size} bytes; at most {limit} are read")
    data = fetch(url, {"Range": f"bytes=-{size}" if start < 0 else f"bytes={start}-{start + size - 1}"})
    if len(data) > size:
        raise ValueError(f"{untrusted.shown_url(url)} answers {len(data)} bytes to a range of {size}; Range ignored?")
    return data


def _inflated(data: bytes, method: int, *, what: str) -> bytes:
    """A zip member's bytes, stored or deflated: at most MAX_METADATA once inflated, the bound
    PEP 658's ``.metadata`` file has (1 MB of deflate can inflate to 1 GB)."""
    if method != 8:
        return data
    out = zlib.decompressobj(-15).decompress(data, MAX_METADATA + 1)
    if len(out) > MAX_METADATA:
        raise ValueError(f"{what}: more than {MAX_METADATA >> 20} MiB of METADATA")
    return out


def metadata_by_range(fetch: Fetch, url: str) -> str:
    """A wheel's METADATA through HTTP range requests: the zip's end record, its directory, one member."""
    shown = untrusted.shown_url(url)
    tail = _range(fetch, url, -1, _TAIL, limit=_TAIL)
    end = tail.rfind(b"PK\x05\x06")
    if end < 0:
        raise ValueError(f"{shown}: no zip end record in the last 64 KiB")
    cd_size, cd_offset = struct.unpack("<II", tail[end + 12 : end + 20])
    if cd_offset == 0xFFFFFFFF:
        locator = tail.rfind(b"PK\x06\x07")
        (zip64_end,) = struct.unpack("<Q", tail[locator + 8 : locator + 16])
        record = _range(fetch, url, zip64_end, 56, limit=56)
        cd_size, cd_offset = struct.unpack("<QQ", record[40:56])
    directory = _range(fetch, url, cd_offset, cd_size, limit=untrusted.MAX_PAGE)
    pos = 0
    while directory[pos : pos + 4] == b"PK\x01\x02":
        method, _t, _d, _crc, size, _usize, name_len, extra_len, comment_len = struct.unpack(
            "<HHHIIIHHH", directory[pos + 10 : pos + 34]
        )
        (offset,) = struct.unpack("<I", directory[pos + 42 : pos + 46])
        name = directory[pos + 46 : pos + 46 + name_len].decode()
        pos += 46 + name_len + extra_len + comment_len
        if name.endswith(".dist-info/METADATA") and name.count("/") == 1:
            local = _range(fetch, url, offset, 30, limit=30)
            local_name, local_extra = struct.unpack("<HH", local[26:30])
            data = _range(fetch, url, offset + 30 + local_name + local_extra, size, limit=MAX_METADATA)
            what = untrusted.shown(name)
            return untrusted.decode_text(_inflated(data, method, what=what), what=what)
    raise ValueError(f"{shown}: no .dist-info/METADATA in the wheel")


def wheel_metadata(fetch: Fetch, wheel: simple_index.File) -> str:
    """The METADATA of ``wheel``: PEP 658's ``<url>.metadata`` where the page announces one,
    checked against the sha256 announced with it as every download is (``source.check_sha256``);
    else read from the wheel by range requests.

    - ``true`` without a hash: the file is used unchecked, as pip uses it. PyPI always sends a
      hash; an index that sends none offers nothing to check, and the wheel read by ranges
      would be unchecked too.
    - hashes of other algorithms only (``md5=...``): refused. The page meant the file to be
      checked, and fa-images checks sha256; a page that names an algorithm no one here reads
      must not turn the check off.
    """
    if wheel.metadata is None:  # not announced: uploads before PyPI extracted it
        return metadata_by_range(fetch, wheel.url)
    url = wheel.url + ".metadata"
    name = untrusted.shown(f"{wheel.filename}.metadata")  # not the URL: it may carry the index's token
    expected = wheel.metadata_sha256
    if wheel.metadata and expected is None:
        algorithms = ", ".join(sorted({a for a, _ in wheel.metadata}))
        raise UsageError(
            f"{name}: the index announces it with a {untrusted.shown(algorithms)} hash only; "
            "fa-images checks sha256, so it refuses the file",
            hint="an index serving PEP 658 metadata should announce its sha256",
        )
    try:
        data = fetch(url, {})
    except FileNotFoundError:  # announced but not there: the wheel itself still says it
        return metadata_by_range(fetch, wheel.url)
    if len(data) > MAX_METADATA:
        raise ValueError(f"{name}: more than {MAX_METADATA >> 20} MiB of METADATA")
    if expected is not None:
        try:
            source.check_sha256(hashlib.sha256(data).hexdigest(), expected, shown_as=name)
        except SourceError as exc:
            raise UsageError(
                exc.message, hint="the index's page and the .metadata file it serves disagree; nothing was written"
            ) from None
    return untrusted.decode_text(data, what=name)


def pypi_torch(fetch: Fetch, pypi: str, min_torch: str, apart: tuple[str, ...] = ()) -> dict[str, TorchFacts]:
    """Final torch releases >= min_torch on PyPI: their Pythons, default CUDA and its libraries."""
    page = f"{pypi.rstrip('/')}/torch/"
    wheels: dict[str, dict[str, simple_index.File]] = {}  # version -> cp tag -> wheel
    for f in simple_index.parse(fetch(page, {"Accept": simple_index.ACCEPT}), url=page).files:
        found = _linux_torch_wheel(f.filename)
        if found is None or f.yanked:
            continue
        version, python = found
        parsed = _final(version)
        if parsed is None or parsed < Version(min_torch):
            continue
        # A build tag (torch-2.10.0-3-cp311-...: a re-upload) names the same release.
        wheels.setdefault(version, {})[python] = f  # its URL absolute, and on the page's host
    out = {}
    for version, by_python in sorted(wheels.items(), key=lambda kv: Version(kv[0])):
        pythons = sorted(by_python, key=int)
        sample = by_python[pythons[-1]]  # the newest Python's wheel: any one carries the same pins
        default, unread, libraries = None, None, {}
        try:
            metadata = wheel_metadata(fetch, sample)
            default = default_cuda_of(metadata)
            layers = library_layers(metadata, _py(pythons[-1]), apart)
            libraries = {default: layers} if default and layers else {}
        except (FileNotFoundError, IndexUnreachable, ValueError, struct.error, zlib.error) as exc:
            unread = str(exc)  # reported by refresh(): the release keeps what the table knows
        out[version] = TorchFacts(
            version=version,
            pythons=[_py(p) for p in pythons],
            default_cuda=default,
            unread=unread,
            libraries=libraries,
        )
    return out


def torch_variants(fetch: Fetch, torch_index: str) -> dict[str, set[str]]:
    """version -> CUDA variants, from the torch index's file list (HTML, PEP 503)."""
    page = f"{torch_index.rstrip('/')}/torch/"
    out: dict[str, set[str]] = {}
    for f in simple_index.parse(fetch(page, {"Accept": simple_index.ACCEPT}), url=page).files:
        found = _linux_torch_wheel(f.filename)
        if found is None:
            continue
        release, _, local = found[0].partition("+")
        cu = re.fullmatch(r"cu(\d+)", local)
        if cu and _final(release) is not None:
            out.setdefault(release, set()).add(f"{cu[1][:-1]}.{cu[1][-1]}")
    return out


def _linux_torch_wheel(filename: str) -> tuple[str, str] | None:
    """(version, Python) of a torch wheel for CPython on x86_64 Linux, by the wheel name's own
    grammar (PEP 427, build tags included); None for anything else, free-threaded builds too.
    The version is also a word of the table's grammar, since it reaches the YAML."""
    try:
        name, version, _build, tags = parse_wheel_filename(filename)
    except (InvalidWheelFilename, InvalidVersion):
        return None
    pythons = {
        tag.interpreter[2:]
        for tag in tags
        if tag.interpreter == tag.abi
        and re.fullmatch(r"cp3\d+", tag.interpreter)
        and re.fullmatch(r"(manylinux\w*|linux)_x86_64", tag.platform)
    }
    if name != "torch" or len(pythons) != 1 or grammar.version(str(version).partition("+")[0]) is not None:
        return None
    return str(version), pythons.pop()


def abi_rule(torch: str, cuda: str) -> bool:
    """PyTorch's pip wheels: new C++11 ABI from 2.7, and for 2.6.0+cu126; old before."""
    release = Version(torch)
    return release >= Version("2.7") or (release.release[:2] == (2, 6) and Version(cuda) >= Version("12.6"))


def flash_attn_sdists(fetch: Fetch, pypi: str) -> dict[str, str]:
    out = {}
    page = f"{pypi.rstrip('/')}/flash-attn/"
    for f in simple_index.parse(fetch(page, {"Accept": simple_index.ACCEPT}), url=page).files:
        match = re.fullmatch(r"flash_attn-(.+)\.tar\.gz", f.filename)
        # A crafted name never reaches the YAML; a digest is checked where it is used (refresh).
        if match and not f.yanked and f.sha256 and grammar.version(match.group(1)) is None:
            out[match.group(1)] = f.sha256
    return out


@dataclass(frozen=True)
class TorchUpdate:
    """What changed in a torch release both tables hold; empty fields did not change."""

    version: str
    cuda_added: tuple[str, ...] = ()
    cuda_removed: tuple[str, ...] = ()
    abi_changed: tuple[str, ...] = ()  # the CUDA variants whose cxx11_abi differs
    libraries_changed: tuple[str, ...] = ()  # the CUDA variants whose library pins differ
    python_added: tuple[str, ...] = ()
    python_removed: tuple[str, ...] = ()
    default_cuda: tuple[str, str] | None = None  # (before, after)

    def as_json(self) -> dict:
        out: dict = {"version": self.version}
        changes = ("cuda_added", "cuda_removed", "abi_changed", "libraries_changed", "python_added", "python_removed")
        for name in changes:
            if getattr(self, name):
                out[name] = list(getattr(self, name))
        if self.default_cuda:
            out["default_cuda"] = {"before": self.default_cuda[0], "after": self.default_cuda[1]}
        return out

    def line(self) -> str:
        parts = [
            f"{what} {', '.join(values)} {how}"
            for what, values, how in (
                ("CUDA", self.cuda_added, "added"),
                ("CUDA", self.cuda_removed, "removed"),
                ("the C++ ABI of CUDA", self.abi_changed, "changed"),
                ("the CUDA libraries of CUDA", self.libraries_changed, "changed"),
                ("Python", self.python_added, "added"),
                ("Python", self.python_removed, "removed"),
            )
            if values
        ]
        if self.default_cuda:
            parts.append(f"default CUDA {self.default_cuda[0]} -> {self.default_cuda[1]}")
        return f"torch {self.version}: " + "; ".join(parts)


def _torch_update(before: compat_mod.TorchRelease, after: compat_mod.TorchRelease) -> TorchUpdate | None:
    old = {v.cuda: v.cxx11_abi for v in before.variants}
    new = {v.cuda: v.cxx11_abi for v in after.variants}
    before_libraries = {v.cuda: v.libraries for v in before.variants}
    libraries = {v.cuda: v.libraries for v in after.variants}
    update = TorchUpdate(
        version=after.version,
        cuda_added=_sorted(set(new) - set(old)),
        cuda_removed=_sorted(set(old) - set(new)),
        abi_changed=_sorted(c for c in set(old) & set(new) if old[c] != new[c]),
        libraries_changed=_sorted(c for c in set(old) & set(new) if libraries[c] != before_libraries[c]),
        python_added=_sorted(set(after.pythons) - set(before.pythons)),
        python_removed=_sorted(set(before.pythons) - set(after.pythons)),
        default_cuda=None if before.default_cuda == after.default_cuda else (before.default_cuda, after.default_cuda),
    )
    return None if update == TorchUpdate(version=after.version) else update


def _sorted(versions: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(versions, key=Version))


def _torch_json(release: compat_mod.TorchRelease) -> dict:
    return {
        "version": release.version,
        "python": list(release.pythons),
        "default_cuda": release.default_cuda,
        "cuda": {v.cuda: _variant_json(v) for v in release.variants},
    }


def _variant_json(variant: compat_mod.CudaVariant) -> dict:
    libraries = {"libraries": [list(layer) for layer in variant.libraries]} if variant.libraries else {}
    return {"cxx11_abi": variant.cxx11_abi, **libraries}


def _flash_attn_json(release: compat_mod.FlashAttnRelease) -> dict:
    return {"version": release.version, "sha256": release.sha256, "cuda_archs_env": release.cuda_archs_env}


@dataclass(frozen=True)
class TableDiff:
    """What a refresh changed in the table's generated facts: every torch release and flash-attn
    sdist added, removed or updated, in version order."""

    torch_added: tuple[compat_mod.TorchRelease, ...] = ()
    torch_removed: tuple[compat_mod.TorchRelease, ...] = ()
    torch_updated: tuple[TorchUpdate, ...] = ()
    flash_attn_added: tuple[compat_mod.FlashAttnRelease, ...] = ()
    flash_attn_removed: tuple[compat_mod.FlashAttnRelease, ...] = ()
    # (before, after): an sdist's pinned sha256 that changed is refused before a diff is made
    flash_attn_updated: tuple[tuple[compat_mod.FlashAttnRelease, compat_mod.FlashAttnRelease], ...] = ()

    @property
    def changed(self) -> bool:
        return self != TableDiff()

    def lines(self) -> list[str]:
        """One line per release that changed, then the count; or the one line that nothing did."""
        out = []
        for release in self.torch_added:
            cudas = ", ".join(v.cuda for v in release.variants)
            pythons = ", ".join(release.pythons)
            out.append(
                f"torch {release.version}: added (CUDA {cudas}; default {release.default_cuda}; Python {pythons})"
            )
        out += [f"torch {release.version}: removed" for release in self.torch_removed]
        out += [update.line() for update in self.torch_updated]
        out += [f"flash-attn {release.version}: added" for release in self.flash_attn_added]
        out += [f"flash-attn {release.version}: removed" for release in self.flash_attn_removed]
        for before, after in self.flash_attn_updated:
            old, new = _flash_attn_json(before), _flash_attn_json(after)
            out.append(
                f"flash-attn {after.version}: "
                + "; ".join(f"{k} {old[k]} -> {new[k]}" for k in old if old[k] != new[k])
            )
        return out + [self.summary()]

    def summary(self) -> str:
        if not self.changed:
            return "no change: the same torch releases and flash-attn sdists as the table"
        groups = (
            ("torch releases", self.torch_added, self.torch_removed, self.torch_updated),
            ("flash-attn sdists", self.flash_attn_added, self.flash_attn_removed, self.flash_attn_updated),
        )
        counts = []
        for name, *changes in groups:
            done = [f"{len(c)} {how}" for c, how in zip(changes, ("added", "removed", "updated")) if c]
            counts += [f"{name}: {', '.join(done)}"] if done else []
        return "changed: " + "; ".join(counts)

    def as_json(self) -> dict:
        return {
            "changed": self.changed,
            "torch": {
                "added": [_torch_json(r) for r in self.torch_added],
                "removed": [_torch_json(r) for r in self.torch_removed],
                "updated": [u.as_json() for u in self.torch_updated],
            },
            "flash_attn": {
                "added": [_flash_attn_json(r) for r in self.flash_attn_added],
                "removed": [_flash_attn_json(r) for r in self.flash_attn_removed],
                "updated": [
                    {"before": _flash_attn_json(b), "after": _flash_attn_json(a)} for b, a in self.flash_attn_updated
                ],
            },
        }


def table_diff(before: compat_mod.Compat, after: compat_mod.Compat) -> TableDiff:
    """The torch releases and flash-attn sdists that differ between two tables."""
    torch_both = _sorted(set(before.torch) & set(after.torch))
    updates = (_torch_update(before.torch[v], after.torch[v]) for v in torch_both)
    fa_both = _sorted(set(before.flash_attn) & set(after.flash_attn))
    return TableDiff(
        torch_added=tuple(after.torch[v] for v in _sorted(set(after.torch) - set(before.torch))),
        torch_removed=tuple(before.torch[v] for v in _sorted(set(before.torch) - set(after.torch))),
        torch_updated=tuple(u for u in updates if u is not None),
        flash_attn_added=tuple(after.flash_attn[v] for v in _sorted(set(after.flash_attn) - set(before.flash_attn))),
        flash_attn_removed=tuple(before.flash_attn[v] for v in _sorted(set(before.flash_attn) - set(after.flash_attn))),
        flash_attn_updated=tuple(
            (before.flash_attn[v], after.flash_attn[v]) for v in fa_both if before.flash_attn[v] != after.flash_attn[v]
        ),
    )


@dataclass
class Refresh:
    text: str
    notes: list[str]  # what to know about how the facts were found (an index not reached, a release left out)
    diff: TableDiff  # what changed in the table


def _scalar(value: str | bool) -> str:
    """One YAML scalar, by a serializer: a JSON string is a YAML double-quoted scalar, so no
    value, whatever it holds, can end its line or add a key."""
    return json.dumps(value)


def _torch_section(releases: dict[str, TorchFacts]) -> str:
    lines = ["torch:"]
    for facts in releases.values():
        lines.append(f"  {_scalar(facts.version)}:")
        lines.append(f"    python: [{', '.join(_scalar(p) for p in facts.pythons)}]")
        lines.append(f"    default_cuda: {_scalar(facts.default_cuda or '')}")
        lines.append("    cuda:")
        for cuda in sorted(facts.variants, key=Version):
            abi = f"cxx11_abi: {_scalar(facts.variants[cuda])}"
            if cuda not in facts.libraries:
                lines.append(f"      {_scalar(cuda)}: {{{abi}}}")
                continue
            lines += [f"      {_scalar(cuda)}:", f"        {abi}", "        libraries:"]
            for layer in facts.libraries[cuda]:  # a flow sequence may span lines: no pin holds a space
                words = ", ".join(_scalar(p) for p in layer)
                lines += textwrap.wrap(
                    f"[{words}]",
                    110,
                    initial_indent=" " * 10 + "- ",
                    subsequent_indent=" " * 13,
                    break_on_hyphens=False,
                    break_long_words=False,
                )
    return "\n".join(lines) + "\n"


def _flash_attn_section(known: dict[str, compat_mod.FlashAttnRelease], shas: dict[str, str]) -> str:
    lines = ["flash_attn:"]
    for version in sorted(known, key=Version):
        rel = known[version]
        sha, env = shas.get(version, rel.sha256), _scalar(rel.cuda_archs_env)
        lines.append(f"  {_scalar(version)}: {{sha256: {_scalar(sha)}, cuda_archs_env: {env}}}")
    return "\n".join(lines) + "\n"


def splice(text: str, section: str, body: str) -> str:
    pattern = re.compile(rf"(# BEGIN generated {section}\n).*?(# END generated {section}\n)", re.S)
    if not pattern.search(text):
        raise UsageError(f"the table has no '# BEGIN generated {section}' ... '# END generated {section}' block")
    return pattern.sub(lambda m: m.group(1) + body + m.group(2), text, count=1)


def refresh(
    table: Path,
    *,
    fetch: Fetch = http_fetch,
    pypi: str = PYPI,
    torch_index: str = TORCH_INDEX,
    min_torch: str = MIN_TORCH,
) -> Refresh:
    """The table's text with its generated sections rebuilt from the indexes, and what happened."""
    doc = yamlfile.load(table, what="compat table")
    current = compat_mod.build(doc)
    text = untrusted.read_file(table, limit=yamlfile.MAX_BYTES, what="compat table").decode("utf-8")
    notes: list[str] = []
    # The layers' rule of the table merged over the built-in one: a team's table that overrides a
    # few keys takes the built-in rule. Read here, at refresh: the table then holds the layers.
    apart = compat_mod.load(table).libraries_apart
    try:
        found = pypi_torch(fetch, pypi, min_torch, apart)
        shas = flash_attn_sdists(fetch, pypi)
    except (IndexUnreachable, FileNotFoundError, ValueError, KeyError) as exc:
        raise UsageError(
            f"cannot refresh from {untrusted.shown_url(pypi)}: {exc}",
            hint="PyPI, or a PEP 691 mirror given with --pypi, must answer",
        ) from None
    try:
        variants: dict[str, set[str]] | None = torch_variants(fetch, torch_index)
    except (IndexUnreachable, FileNotFoundError, ValueError) as exc:
        variants = None
        notes.append(f"torch index not reached ({exc}): CUDA variants kept from the table; new releases get PyPI's")
    index = "PyPI" if pypi == PYPI else "the index"  # a mirror's URL may hold its login: not shown
    releases: dict[str, TorchFacts] = {}
    found_but_unusable: set[str] = set()
    for version, facts in found.items():
        old = current.torch.get(version)
        cudas = set(variants.get(version, ())) if variants is not None else set()
        if old is not None:
            cudas |= {v.cuda for v in old.variants}
        if facts.default_cuda:
            cudas.add(facts.default_cuda)
        unknown = sorted(c for c in cudas if c not in current.cuda)
        if unknown:
            notes.append(f"torch {version}: CUDA {', '.join(unknown)} not in the cuda section; left out")
            cudas -= set(unknown)
        if facts.default_cuda not in cudas:
            why = f" (its METADATA: {facts.unread})" if facts.unread else ""
            notes.append(
                f"torch {version}: default CUDA {facts.default_cuda} is not usable here{why}; release left out"
            )
            found_but_unusable.add(version)
            continue
        abis = {v.cuda: v.cxx11_abi for v in old.variants} if old else {}
        facts.variants = {c: abis.get(c, abi_rule(version, c)) for c in cudas}
        tabled = {v.cuda: v.libraries for v in old.variants} if old else {}
        facts.libraries = {c: layers for c in cudas if (layers := facts.libraries.get(c) or tabled.get(c))}
        releases[version] = facts
    for version in current.torch:
        if version not in releases:
            why = f"{index}'s facts unusable" if version in found_but_unusable else f"not found on {index}"
            notes.append(f"torch {version}: in the table, {why}; kept as it was")
            old = current.torch[version]
            releases[version] = TorchFacts(
                version=version,
                pythons=list(old.pythons),
                default_cuda=old.default_cuda,
                variants={v.cuda: v.cxx11_abi for v in old.variants},
                libraries={v.cuda: v.libraries for v in old.variants if v.libraries},
            )
    releases = dict(sorted(releases.items(), key=lambda kv: Version(kv[0])))

    known = dict(current.flash_attn)
    for version, rel in known.items():
        if version not in shas:
            notes.append(f"flash-attn {version}: no sdist on {index}; kept as pinned")
        elif shas[version] != rel.sha256:
            raise UsageError(
                f"flash-attn {version}: PyPI publishes sha256 {shas[version][:16]}..., "
                f"the table pins {rel.sha256[:16]}...",
                hint="an sdist was replaced upstream; check it before changing the pin",
            )
    newest = max((Version(v) for v in known), default=Version("0"))
    for version, sha in shas.items():
        parsed = _final(version)
        if not grammar.SHA256.fullmatch(sha):
            notes.append(f"flash-attn {version}: PyPI's sha256 {sha[:80]!r} is not 64 hex digits; left out")
        elif parsed and parsed > newest and parsed in current.flash_attn_range:
            known[version] = compat_mod.FlashAttnRelease(version=version, sha256=sha, cuda_archs_env=True)
    text = splice(text, "torch", _torch_section(releases))
    text = splice(text, "flash_attn", _flash_attn_section(known, shas))
    return Refresh(text=text, notes=notes, diff=table_diff(current, validate(text, table)))


def validate(text: str, table: Path) -> compat_mod.Compat:
    """The refreshed table as ``plan`` would load it (over the built-in one, unless it is the
    built-in one): checked in full before a byte is written. Returned as the table alone, as
    ``refresh`` read the table before, so the two compare fact for fact."""
    doc = yamlfile.parse(text.encode("utf-8"), shown=f"{table} (refreshed)", what="refreshed compat table")
    if table.resolve() != compat_mod.DEFAULT_FILE.resolve():
        base = yamlfile.load(compat_mod.DEFAULT_FILE, what="compat table")
        compat_mod.build(yamlfile.YamlDoc(data=compat_mod.merge(base.data, doc.data), file=doc.file, lines=doc.lines))
    return compat_mod.build(doc)

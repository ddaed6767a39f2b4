"""Wheel variants (PEP 825, a draft; uv's ``--preview-features wheel-variants``): each GPU class's
wheel again as a variant of one version, so that a resolver that knows the node's GPU picks the
class's kernels from one index.

A class's wheel is named by its +label (``2.8.3+cu128torch2.9cxx11abitrue.sm80``); its variant
twin carries the version without the class (``2.8.3+cu128torch2.9cxx11abitrue``), the class as
its variant label (``…-linux_x86_64-sm80.whl``), and ``variant.json`` in its dist-info naming
NVIDIA's provider properties: ``sm_arch`` (``80_real`` for each cubin arch, ``…_virtual`` for
PTX) and ``cuda_version_lower_bound`` (CUDA's minor version compatibility: a 12.x build runs
on a 12.0 driver). The index lists the twins with ``{name}-{version}-variants.json``, the union
of their ``variant.json``. uv answers for NVIDIA's provider itself, from the driver it sees, or
from ``NV_VARIANT_PROVIDER_FORCE_CUDA_DRIVER_VERSION`` and ``NV_VARIANT_PROVIDER_FORCE_SM_ARCH``.

Stdlib and packaging only: this module travels into every build context.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import parse_wheel_filename

from . import gpuarch, settings

# What uv 0.13.8 recognises (its built-in NVIDIA provider answers only for this plugin and a
# range that holds 0.0.1); the compat table pins the same (`wheel_variants:`), a test holds them equal.
SCHEMA = "https://variants-schema.wheelnext.dev/peps/825/v0.1.1.json"
NAMESPACE = "nvidia"
PLUGIN_API = "nvidia_variant_provider.plugin:NvidiaVariantPlugin"
PROVIDER_REQUIRES = "nvidia-variant-provider>=0.0.1,<1.0.0"
FOLDER = "variants"  # dist/variants/: the twins, made from dist/'s own wheels
LABEL = re.compile(r"[0-9a-z_.]+", re.ASCII)  # PEP 825's variant label
_EPOCH = (1980, 1, 1, 0, 0, 0)  # the twin's own member (variant.json): no time of its making


@dataclass(frozen=True)
class Twin:
    """A class wheel's variant twin: its file name, label, version without the class, properties."""

    source: str  # the class wheel's file name in dist/
    name: str  # the twin's file name
    label: str
    version: str  # the version it shares with the other classes' twins
    properties: dict[str, list[str]]

    @property
    def index_file(self) -> str:
        """``{name}-{version}-variants.json``: the name as the wheel's file name writes it."""
        return f"{self.name.split('-', 1)[0]}-{self.version}-variants.json"


def twin_of(name: str, *, archs: Iterable[str] = (), ptx: bool = False, cuda: str | None = None) -> Twin | None:
    """The variant twin of a dist/ wheel, or None for a wheel that names no GPU class."""
    _project, version, _build, _tags = parse_wheel_filename(name)
    cls = settings.gpu_class_of(version.local)
    if cls is None or not LABEL.fullmatch(cls) or version.local is None:
        return None
    base = str(version).removesuffix(f".{cls}")
    stem, _, rest = name.removesuffix(".whl").partition("-")
    tags = rest.partition("-")[2]  # what follows the version: python-abi-platform
    cubins = gpuarch.sorted_archs(a for a in archs if not a.endswith(("a", "f")))
    properties = {"sm_arch": [f"{a}_real" for a in cubins] + [f"{a}_virtual" for a in gpuarch.built_ptx(cubins, ptx)]}
    if cuda:
        properties["cuda_version_lower_bound"] = [f"{cuda.split('.')[0]}.0"]
    return Twin(source=name, name=f"{stem}-{base}-{tags}-{cls}.whl", label=cls, version=base, properties=properties)


def document(twins: Iterable[Twin]) -> dict:
    """``variant.json`` of one twin, or the index's ``variants.json`` of several: the same schema."""
    return {
        "$schema": SCHEMA,
        "default-priorities": {"namespace": [NAMESPACE]},
        "providers": {NAMESPACE: {"plugin-api": PLUGIN_API, "requires": [PROVIDER_REQUIRES]}},
        "variants": {t.label: {NAMESPACE: t.properties} for t in sorted(twins, key=lambda t: t.label)},
    }


def make(source: Path, twin: Twin, out: Path) -> None:
    """Writes ``twin`` to ``out`` from its class wheel ``source``: the same members and times, its
    dist-info renamed for the shared version, METADATA's Version with it, variant.json added,
    RECORD written anew. The same source gives the same bytes. Each member is streamed: a wheel's
    extension may be hundreds of MB."""
    old_info = f"{twin.source.split('-', 1)[0]}-{parse_wheel_filename(twin.source)[1]}.dist-info/"
    new_info = f"{twin.name.split('-', 1)[0]}-{twin.version}.dist-info/"
    record: list[str] = []
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            name = new_info + info.filename[len(old_info) :] if info.filename.startswith(old_info) else info.filename
            if name == f"{new_info}RECORD":
                continue
            if name == f"{new_info}METADATA":
                data = re.sub(rb"(?m)^Version: .*$", f"Version: {twin.version}".encode(), src.read(info), count=1)
                _add(dst, name, data, info.date_time, info.external_attr, record)
                continue
            entry = _entry(name, info.date_time, info.external_attr)
            digest, size = hashlib.sha256(), 0
            with src.open(info) as reader, dst.open(entry, "w") as writer:
                while chunk := reader.read(1 << 20):
                    digest.update(chunk)
                    size += len(chunk)
                    writer.write(chunk)
            record.append(f"{name},sha256={_b64(digest.digest())},{size}")
        variant = json.dumps(document([twin]), indent=2, sort_keys=True).encode() + b"\n"
        _add(dst, f"{new_info}variant.json", variant, _EPOCH, 0o644 << 16, record)
        record.append(f"{new_info}RECORD,,")
        _add(dst, f"{new_info}RECORD", ("\n".join(record) + "\n").encode(), _EPOCH, 0o644 << 16, [])


def _entry(name: str, when: tuple, mode: int) -> zipfile.ZipInfo:
    entry = zipfile.ZipInfo(name, date_time=when)
    entry.external_attr = mode
    entry.compress_type = zipfile.ZIP_DEFLATED
    return entry


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _add(dst: zipfile.ZipFile, name: str, data: bytes, when: tuple, mode: int, record: list[str]) -> None:
    dst.writestr(_entry(name, when, mode), data)
    record.append(f"{name},sha256={_b64(hashlib.sha256(data).digest())},{len(data)}")

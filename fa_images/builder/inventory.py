"""What an image holds, for its SBOM: every Python distribution installed, with its version and the
sha256 of its RECORD (the list of its files and their hashes), and the CUDA libraries torch loads
(its CUDA runtime, cuDNN and NCCL, as torch reports them). Printed as one ``INVENTORY:`` line,
which the host reads bounded, as it reads anything an image says.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
import re
from typing import Any

from . import untrusted
from .contract import INVENTORY_PREFIX

MAX_LINE = 8 << 20  # a site of a few thousand distributions; anything longer is not an inventory
MAX_PACKAGES = 20_000
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+!_-]{0,127}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def packages() -> list[dict[str, Any]]:
    found = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        if not name:
            continue
        record = dist.read_text("RECORD")
        digest = hashlib.sha256(record.encode()).hexdigest() if record is not None else None
        found[name.lower()] = {"name": name, "version": dist.version, "record_sha256": digest}
    return [found[k] for k in sorted(found)]


def cuda_libraries() -> dict[str, str | None]:
    """The versions torch reports of the CUDA libraries it loads (none where torch is missing)."""
    try:
        import torch
    except ImportError:
        return {}
    nccl = None
    try:
        version = torch.cuda.nccl.version()
        nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    except Exception:  # a CPU build, or NCCL not loadable without a GPU: unknown, not an error
        nccl = None
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {"cuda": torch.version.cuda, "cudnn": None if cudnn is None else str(cudnn), "nccl": nccl}


def inventory() -> dict[str, Any]:
    return {"python": platform.python_version(), "packages": packages(), "libraries": cuda_libraries()}


def line() -> str:
    return INVENTORY_PREFIX + json.dumps(inventory(), sort_keys=True)


def parse(lines: list[str]) -> dict[str, Any]:
    """The inventory an image printed (its last ``INVENTORY:`` line), every field checked;
    ValueError where it printed none or one that is not what ``line`` writes."""
    found = [line for line in lines if line.startswith(INVENTORY_PREFIX)]
    if not found:
        raise ValueError("the image printed no inventory")
    text = found[-1].removeprefix(INVENTORY_PREFIX)
    if len(text) > MAX_LINE:
        raise ValueError(f"the inventory line is over {MAX_LINE} characters")
    data = untrusted.parse_json(text.encode(), what="the inventory line")
    raw = data.get("packages") if isinstance(data, dict) else None
    if not isinstance(raw, list) or len(raw) > MAX_PACKAGES:
        raise ValueError(f"the inventory's packages are not a list of at most {MAX_PACKAGES}")
    checked = []
    for item in raw:
        if not isinstance(item, dict):
            raise ValueError("an inventory package is not an object")
        name, version, record = item.get("name"), item.get("version"), item.get("record_sha256")
        if not (
            isinstance(name, str) and _NAME.fullmatch(name) and isinstance(version, str) and _VERSION.fullmatch(version)
        ):
            raise ValueError("an inventory package has no valid name and version")
        if record is not None and not (isinstance(record, str) and _SHA256.fullmatch(record)):
            raise ValueError(f"inventory package {name}: record_sha256 is not a sha256")
        checked.append({"name": name, "version": version, "record_sha256": record})
    libraries = data.get("libraries") if isinstance(data.get("libraries"), dict) else {}
    versions = {
        k: v
        for k, v in libraries.items()
        if k in ("cuda", "cudnn", "nccl") and isinstance(v, str) and _VERSION.fullmatch(v)
    }
    python = data.get("python")
    return {
        "python": python if isinstance(python, str) and _VERSION.fullmatch(python) else None,
        "packages": checked,
        "libraries": versions,
    }

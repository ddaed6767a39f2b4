"""Re-pack installed distributions into wheels, from their RECORD files.

A machine with no package index but with torch installed can still serve a wheelhouse:
every file a distribution installed is listed in its RECORD, so the wheel can be put back
together (RECORD rewritten with fresh hashes; console scripts are left out, as pip makes
them again from entry_points.txt). Used by device.sh for a ``find_links`` wheelhouse.

    python repack_wheels.py OUT_DIR 'torch==2.11.0' [more requirements...]

Takes the dependency closure (markers and extras evaluated for this interpreter), and
exits 1 naming any requirement that is not installed.
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from concurrent.futures import ProcessPoolExecutor
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

SKIP_IN_DIST_INFO = {"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"}


def closure(roots: list[str]) -> tuple[dict[str, metadata.Distribution], list[str]]:
    installed = {canonicalize_name(d.metadata["Name"]): d for d in metadata.distributions()}
    found: dict[str, metadata.Distribution] = {}
    missing: list[str] = []
    queue = [(Requirement(r), frozenset()) for r in roots]
    seen: set[tuple[str, frozenset]] = set()
    while queue:
        req, _ = queue.pop()
        name = canonicalize_name(req.name)
        key = (name, frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        dist = installed.get(name)
        if dist is None or (req.specifier and not req.specifier.contains(dist.version, prereleases=True)):
            missing.append(f"{req} (installed: {dist.version if dist else 'none'})")
            continue
        found[name] = dist
        for text in dist.requires or []:
            sub = Requirement(text)
            extras = [""] + sorted(req.extras)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in extras):
                queue.append((sub, frozenset()))
    return found, missing


def _tag(dist: metadata.Distribution) -> str:
    lines = (dist.read_text("WHEEL") or "").splitlines()
    tags = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Tag:")]
    if not tags:
        return "py3-none-any"
    parts = [sorted({t.split("-")[i] for t in tags}) for i in range(3)]
    return "-".join(".".join(p) for p in parts)


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def repack(name: str, out_dir: str) -> str:
    dist = next(d for d in metadata.distributions() if canonicalize_name(d.metadata["Name"]) == name)
    base = Path(dist.locate_file(""))
    info_dir = Path(dist._path).name  # type: ignore[attr-defined]  # the .dist-info folder
    wheel_name = f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}-{_tag(dist)}.whl"
    path = Path(out_dir) / wheel_name
    records, skipped = [], 0
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for f in dist.files or []:
            rel = f.as_posix()
            if rel.startswith("..") or "__pycache__" in rel or rel.endswith(".pyc"):
                skipped += 1  # scripts outside site-packages, byte code: pip makes both again
                continue
            if rel.startswith(info_dir + "/") and rel.split("/", 1)[1] in SKIP_IN_DIST_INFO:
                continue
            source = base / rel
            if not source.is_file():
                skipped += 1
                continue
            data = source.read_bytes()
            zf.writestr(zipfile.ZipInfo(rel, date_time=(2026, 1, 1, 0, 0, 0)), data)
            records.append(f"{rel},{_digest(data)},{len(data)}")
        records.append(f"{info_dir}/RECORD,,")
        zf.writestr(f"{info_dir}/RECORD", "\n".join(records) + "\n")
    return f"{wheel_name}: {len(records) - 1} files, {path.stat().st_size / 1e6:.0f} MB ({skipped} skipped)"


def main() -> int:
    out_dir, roots = sys.argv[1], sys.argv[2:]
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    found, missing = closure(roots)
    if missing:
        print("not installed here: " + "; ".join(missing), file=sys.stderr)
        return 1
    with ProcessPoolExecutor(max_workers=8) as pool:
        for line in pool.map(repack, sorted(found), [out_dir] * len(found)):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

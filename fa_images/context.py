"""Assembles the build context of one entry: Dockerfile, builder package, checked sdist.

The sdist is fetched here, on the host, and checked against its sha256 before it goes
into the context: builds need no network for sources, and credentials for a private index
stay on the host instead of landing in a build arg or a layer.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from . import wheelhouse
from .builder import source
from .matrix import Entry, Matrix
from .render import render_entry

PACKAGE = Path(__file__).resolve().parent


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fa-images"


def fetch_sdist(matrix: Matrix, entry: Entry) -> Path:
    """The entry's sdist from ``packages.sdists``, the local cache or the index, sha256-checked."""
    cache = cache_dir() / "sdists"
    local = Path(matrix.packages.sdists) if matrix.packages.sdists else None
    found_locally = local is not None and (local / source.sdist_name(entry.flash_attn)).is_file()
    path, _sha = source.obtain_sdist(
        version=entry.flash_attn,
        sdist=None,
        dest_dir=cache,
        sha256=entry.sdist_sha256,
        index_url=matrix.packages.flash_attn_index,
        sources_dir=local if found_locally else cache,
    )
    return path


def assemble(matrix: Matrix, entry: Entry, sdist: Path, dest: Path) -> Path:
    """Writes the context into ``dest``: only what the Dockerfile COPYs, so it stays small."""
    (dest / "Dockerfile").write_text(render_entry(matrix, entry))
    package = dest / "fa_images"
    package.mkdir(parents=True)
    shutil.copy2(PACKAGE / "__init__.py", package / "__init__.py")
    shutil.copytree(PACKAGE / "builder", package / "builder", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    sdists = dest / "inputs" / "sdists"
    sdists.mkdir(parents=True)
    shutil.copy2(sdist, sdists / source.sdist_name(entry.flash_attn))
    if wheelhouse.needs_wheelhouse(matrix, entry):
        wheelhouse.fill(matrix, entry, dest / "inputs" / "wheels", cache_dir() / "wheels")
    return dest

"""Assembles the build context of one entry: Dockerfile, builder package, checked sdist.

The sdist is fetched here, on the host, and checked against its sha256 before it goes
into the context: builds need no network for sources, and credentials for a private index
stay on the host instead of landing in a build arg or a layer.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

from ..builder import contract, source
from ..builder.errors import SourceError
from ..config.grammar import BuilderForm
from ..config.matrix import Entry, Matrix
from . import group_cache, wheelhouse
from .render import render_entry

# fa_images/: the build context copies fa_images/__init__.py and builder/ under their own names.
PACKAGE = Path(__file__).resolve().parents[1]


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fa-images"


def source_name(entry: Entry) -> str:
    """The file name of the entry's source, as its generation names it (an sdist, an archive)."""
    return entry.recipe.source_name(entry.flash_attn)


def fetch_sdist(matrix: Matrix, entry: Entry) -> Path | None:
    """The entry's sdist from ``packages.sdists``, the local cache or the index, sha256-checked;
    a pinned archive from ``packages.sdists`` only (no index serves it); None for a generation its
    build installs from the index, pinned (nothing to fetch)."""
    if entry.recipe.source is None:
        return None
    if entry.recipe.source == "archive":
        return source_archive(matrix, entry)
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


def source_archive(matrix: Matrix, entry: Entry) -> Path:
    """The entry's pinned source archive in ``packages.sdists`` (no index serves it), checked
    against its pin; refused, with the command that makes it, where it is not there."""
    name = entry.recipe.source_name(entry.flash_attn)
    local = matrix.archive_path(entry)
    if local is None or not local.is_file():
        raise SourceError(
            f"{entry.id}: no {name} in packages.sdists ({matrix.packages.sdists or 'not set'}): "
            f"{entry.generation.name} is not on PyPI, and its source archive is made from its repositories",
            hint=f"`fa-images source fa{entry.generation.number} --help` says how to make it, "
            "and packages.sdists: DIR finds it",
        )
    if entry.sdist_sha256:
        source.check_sha256(source.tar_sha256(local), entry.sdist_sha256, shown_as=f"{local} (the tar inside)")
    return local


def builder_files() -> list[Path]:
    """The package files every build context carries: the builder, and the package it lives in."""
    builder = [p for p in (PACKAGE / "builder").rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return [PACKAGE / "__init__.py", *sorted(p for p in builder if p.suffix != ".pyc")]


def inputs_digest(
    matrix: Matrix,
    entry: Entry,
    source_sha256: str,
    *,
    base_ids: dict[str, str],
    prebuilt: bool = False,
) -> str:
    """A digest of everything the entry's image and wheel are made of: the Dockerfile (every
    setting that reaches the build, pins included), the builder code, the sdist (or the prebuilt
    wheel: ``source_sha256`` is its sha256, so a published wheel needs no download to be
    compared), and the base images the engine holds (``base_ids``: ref -> image id; a re-pulled
    base is a new input). A build with the same digest makes the same image, so a later run can
    tell it has nothing to do.

    The Dockerfile is taken in one form, whichever builder builds: its two forms differ only in
    how files reach the compile (mounted or copied), not in what is built. So hosts whose docker
    CLIs differ (``auto`` takes BuildKit on one, the SDK's builder on the other) agree on what is
    current, instead of rebuilding each other's entries."""
    digest = hashlib.sha256()

    def part(name: str, data: bytes) -> None:
        digest.update(f"{name}\0{len(data)}\0".encode() + data)

    part("Dockerfile", _instructions(render_entry(matrix, entry, prebuilt=prebuilt, builder="sdk")).encode())
    for path in builder_files():
        part(path.relative_to(PACKAGE.parent).as_posix(), path.read_bytes())
    part("wheel" if prebuilt else "sdist", source_sha256.encode())
    for ref in sorted(base_ids):
        part(f"base {ref}", base_ids[ref].encode())
    return digest.hexdigest()


# Parser directives look like comments but change the build; every other comment does not.
_PARSER_DIRECTIVE = re.compile(r"#\s*(syntax|escape|check)\s*=", re.IGNORECASE)


def _instructions(dockerfile: str) -> str:
    """The Dockerfile less its comments, which change no image: the header names the matrix file
    as it was spelled on the command line, and a path written another way is no new input."""
    kept = [
        line
        for line in dockerfile.splitlines()
        if not line.lstrip().startswith("#") or _PARSER_DIRECTIVE.match(line.lstrip())
    ]
    return "\n".join(kept)


def assemble(
    matrix: Matrix,
    entry: Entry,
    source_file: Path | None,
    dest: Path,
    *,
    form: BuilderForm,
    compiler_cache: Path | None = None,
    prebuilt: bool = False,
) -> Path:
    """Writes the context into ``dest``: only what the Dockerfile COPYs, so it stays small. The
    sdist and the compile group's cache from under ``compiler_cache`` (None: an empty one); or,
    ``prebuilt``, the wheel ``source_file`` and no compiler cache; for a generation that makes no wheel, neither."""
    (dest / "Dockerfile").write_text(render_entry(matrix, entry, prebuilt=prebuilt, builder=form))
    for path in builder_files():
        copy = dest / path.relative_to(PACKAGE.parent)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, copy)
    if prebuilt:
        assert source_file is not None
        wheels = dest / "inputs" / "prebuilt"
        wheels.mkdir(parents=True)
        shutil.copy2(source_file, wheels / source_file.name)
    elif entry.recipe.makes_wheel:  # else it comes from the index, and compiles nothing with nvcc
        assert source_file is not None
        sdists = dest / "inputs" / "sdists"
        sdists.mkdir(parents=True)
        shutil.copy2(source_file, sdists / source_name(entry))
        group_cache.fill(compiler_cache, entry.compile_group, dest / contract.CACHE_CONTEXT_DIR)
    if wheelhouse.private_kinds(matrix, entry):
        wheelhouse.fill(matrix, entry, dest / "inputs" / "wheels", cache_dir() / "wheels")
    return dest

"""``fa-images export bake``: a docker-bake.json with each entry's assembled build context.

Per entry, three targets over one context (``contexts/<entry>/``, the same one ``fa-images
build`` assembles): the runtime image, the tagged builder stage (so a prune keeps the
compile), and the ``wheel`` stage exported to ``wheels/<entry>/`` by a local output, ready for
``fa-images dist merge wheels --dist dist``. Groups: one per compile group (entries sharing
flash-attn, torch, CUDA and archs) and ``default``. Paths are relative to the output dir:
run ``docker buildx bake`` there.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...builder import contract
from ...config.matrix import Entry, Matrix
from ...errors import UsageError
from .. import context
from . import compile_group_name, slug

BAKE_FILE = "docker-bake.json"
CONTEXTS = "contexts"
WHEELS = "wheels"


@dataclass(frozen=True, kw_only=True)
class BakeOptions:
    cache_from: tuple[str, ...] = ()
    cache_to: tuple[str, ...] = ()

    def check(self) -> None:
        for flag, values in (("--cache-from", self.cache_from), ("--cache-to", self.cache_to)):
            for value in values:
                if not value or any(c.isspace() for c in value):
                    raise UsageError(f"{flag} {value!r} is not a cache spec such as type=registry,ref=REGISTRY/cache")


def _labels(entry: Entry) -> dict[str, str]:
    return {
        "fa-images.entry": entry.id,
        "fa-images.compile-group": compile_group_name(entry),
        "fa-images.flash-attn": entry.flash_attn,
        "fa-images.torch": entry.torch,
        "fa-images.cuda": entry.cuda,
        "fa-images.python": entry.python,
        "fa-images.archs": ",".join(entry.archs),
    }


def bake_file(entries: tuple[Entry, ...], opts: BakeOptions) -> dict:
    """The bake definition; contexts are expected at ``contexts/<target>/``."""
    opts.check()
    targets: dict[str, dict] = {}
    groups: dict[str, list[str]] = {}
    for entry in entries:
        name = slug(entry.id)
        base = {"context": f"{CONTEXTS}/{name}", "dockerfile": "Dockerfile"}
        cache: dict[str, list[str]] = {}
        if opts.cache_from:
            cache["cache-from"] = list(opts.cache_from)
        if opts.cache_to:
            cache["cache-to"] = list(opts.cache_to)
        targets[name] = {
            **base,
            "target": contract.RUNTIME_STAGE,
            "tags": [entry.image],
            "labels": _labels(entry),
            **cache,
        }
        targets[f"{name}-builder"] = {**base, "target": contract.BUILDER_STAGE, "tags": [entry.builder_image], **cache}
        targets[f"{name}-wheel"] = {
            **base,
            "target": contract.WHEEL_STAGE,
            "output": [f"type=local,dest={WHEELS}/{name}"],
            **({"cache-from": list(opts.cache_from)} if opts.cache_from else {}),
        }
        groups.setdefault(compile_group_name(entry), []).extend([name, f"{name}-builder", f"{name}-wheel"])
    group = {name: {"targets": members} for name, members in sorted(groups.items())}
    group["default"] = {"targets": list(targets)}
    return {"group": group, "target": targets}


def export(
    matrix: Matrix,
    entries: tuple[Entry, ...],
    out_dir: Path,
    opts: BakeOptions,
    *,
    fetch_sdist: Callable[[Matrix, Entry], Path] = context.fetch_sdist,
    log: Callable[[str], None] = print,
) -> Path:
    """Writes ``out_dir/docker-bake.json`` and one fresh context per entry under ``out_dir/contexts``."""
    definition = bake_file(entries, opts)  # bad flags fail before anything is fetched or written
    out_dir.mkdir(parents=True, exist_ok=True)
    contexts = out_dir / CONTEXTS
    contexts.mkdir(exist_ok=True)
    wanted = {slug(e.id) for e in entries}
    for entry in entries:
        dest = contexts / slug(entry.id)
        staging = contexts / f".{dest.name}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        context.assemble(matrix, entry, fetch_sdist(matrix, entry), staging)
        shutil.rmtree(dest, ignore_errors=True)
        staging.rename(dest)
        log(f"context {dest}")
    for stale in contexts.iterdir():
        if stale.is_dir() and stale.name not in wanted:
            shutil.rmtree(stale)
    path = out_dir / BAKE_FILE
    tmp = path.with_name(f".{BAKE_FILE}.tmp")
    tmp.write_text(json.dumps(definition, indent=2) + "\n")
    tmp.replace(path)
    return path

"""``fa-images export bake``: a docker-bake.json with each entry's assembled build context.

Per entry, three targets over one context (``contexts/<entry>/``, the one ``fa-images build
--builder buildkit`` assembles: the torch venv mounted into the compile, never copied): the
runtime image, the tagged builder stage (so a prune keeps the compile), and the ``wheel`` stage
exported to ``wheels/<entry>/`` by a local output, ready for ``fa-images dist merge wheels --dist
dist``. The compile's cache is the group's cache mount, which BuildKit keeps between bakes.
Groups: one per compile group (entries sharing flash-attn, torch, CUDA and archs) and
``default``. Paths are relative to the output dir: run ``docker buildx bake`` there.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...builder import contract, safe_io, untrusted
from ...builder.wording import counted
from ...config import grammar
from ...config.matrix import Entry, Matrix
from ...errors import FatalError, SourceError, UsageError
from .. import context
from . import compile_group_name, slug

BAKE_FILE = "docker-bake.json"
CONTEXTS = "contexts"
WHEELS = "wheels"
# Beside contexts/: the names of the contexts fa-images made there, one a line; only those are removed.
MADE = ".fa-images-contexts"
_SLUG = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True, kw_only=True)
class BakeOptions:
    cache_from: tuple[str, ...] = ()
    cache_to: tuple[str, ...] = ()

    def check(self) -> None:
        # Bake interpolates ${...} in its JSON too: the grammar admits no $, quote, space or newline.
        for flag, values in (("--cache-from", self.cache_from), ("--cache-to", self.cache_to)):
            for value in values:
                problem = grammar.cache_spec(value)
                if problem:
                    raise UsageError(f"{flag} {problem}")


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
    definition = {"group": group, "target": targets}
    _check_values(definition)
    return definition


def _check_values(value: object) -> None:
    """Defence in depth: no string in the bake file may hold a control character or ${...},
    which bake would interpolate (the matrix grammar already refuses both)."""
    if isinstance(value, dict):
        for item in [*value.keys(), *value.values()]:
            _check_values(item)
    elif isinstance(value, list):
        for item in value:
            _check_values(item)
    elif isinstance(value, str):
        problem = grammar.generated_value(value) or ("holds a '$'" if "$" in value else None)
        if problem:
            raise UsageError(f"refusing to write {value[:80]!r} into the bake file: {problem}")


def export(
    matrix: Matrix,
    entries: tuple[Entry, ...],
    out_dir: Path,
    opts: BakeOptions,
    *,
    fetch_sdist: Callable[[Matrix, Entry], Path | None] = context.fetch_sdist,
    log: Callable[[str], None] = print,
) -> Path:
    """Writes ``out_dir/docker-bake.json`` and one fresh context per entry under ``out_dir/contexts``.

    Through safe_io: a symlinked out dir, ``contexts/`` or ``contexts/<entry>`` is refused, never
    followed. A context is replaced, and a stale one removed, only if fa-images made it: its name
    is in ``.fa-images-contexts`` beside it; anything else there is left alone."""
    definition = bake_file(entries, opts)  # bad flags fail before anything is fetched or written
    sources = _sources(matrix, entries, fetch_sdist)  # every entry's, before anything is written
    out = safe_io.OutputDir(out_dir, what="--out-dir")
    contexts = out.mkdir(CONTEXTS)
    made = _made(out)
    wanted = [slug(e.id) for e in entries]
    for name in wanted:
        kind = out.kind(f"{CONTEXTS}/{name}")
        if kind not in (None, "dir") or (kind == "dir" and name not in made):
            raise UsageError(
                f"{contexts / name} exists and fa-images did not make it ({kind}); "
                "move it away, and export again (fa-images replaces only the contexts it made)"
            )
    for entry, name in zip(entries, wanted):
        staging = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".partial", dir=contexts))
        try:
            context.assemble(matrix, entry, sources[entry.id], staging, form="buildkit")
            if out.kind(f"{CONTEXTS}/{name}") == "dir":
                out.remove_tree(f"{CONTEXTS}/{name}")
            out.rename(f"{CONTEXTS}/{staging.name}", f"{CONTEXTS}/{name}")
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        made.add(name)
        _record(out, made)
        log(f"context {contexts / name}")
    for stale in sorted(made - set(wanted)):
        if out.kind(f"{CONTEXTS}/{stale}") == "dir":
            out.remove_tree(f"{CONTEXTS}/{stale}")
        made.discard(stale)
    _record(out, made)
    return out.write_text(BAKE_FILE, json.dumps(definition, indent=2) + "\n")


def _sources(
    matrix: Matrix, entries: tuple[Entry, ...], fetch_sdist: Callable[[Matrix, Entry], Path | None]
) -> dict[str, Path | None]:
    """Each entry's source, every one tried: what none of them has is refused in one error, before
    anything is written."""
    found: dict[str, Path | None] = {}
    missing: list[str] = []
    for entry in entries:
        try:
            found[entry.id] = fetch_sdist(matrix, entry)
        except FatalError as exc:
            missing.append(exc.message if exc.message.startswith(entry.id) else f"{entry.id}: {exc.message}")
    if missing:
        raise SourceError(f"{counted(len(missing), 'entry')} without a source: " + "; ".join(missing))
    return found


def _made(out: safe_io.OutputDir) -> set[str]:
    """The contexts fa-images made here, from its record (none if there is no record)."""
    path = out.path / MADE
    if out.kind(MADE) != "file":
        return set()
    text = untrusted.decode_text(untrusted.read_file(path, limit=1 << 20, what="record"), what=str(path))
    return {line for line in text.splitlines() if _SLUG.fullmatch(line)}


def _record(out: safe_io.OutputDir, made: set[str]) -> None:
    out.write_text(MADE, "".join(f"{name}\n" for name in sorted(made)))

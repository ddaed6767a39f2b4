"""Plans handed to build farms users already run: a GitHub Actions workflow and a buildx bake file.

Both are rendered from the same entries as ``fa-images build``, deterministically, so the
files can be committed and reviewed like ``dockerfiles/``.
"""

from __future__ import annotations

import re

from ..matrix import Entry

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def slug(text: str) -> str:
    """A name GitHub job ids and bake target names accept (letters, digits, _ and -)."""
    return _UNSAFE.sub("_", text)


def compile_key(entry: Entry) -> tuple[str, str, str, tuple[str, ...], bool]:
    """Entries with the same key can share one kernel compile (the kernels never include Python.h)."""
    return (entry.flash_attn, entry.torch, entry.cuda, entry.archs, entry.ptx)


def compile_group_name(entry: Entry) -> str:
    fa, torch, cuda, archs, ptx = compile_key(entry)
    return slug(f"compile-fa{fa}-torch{torch}-cu{cuda.replace('.', '')}-sm{'_'.join(archs)}{'-ptx' if ptx else ''}")

"""Plans handed to build farms users already run: a GitHub Actions workflow and a buildx bake file.

Both are rendered from the same entries as ``fa-images build``, deterministically, so the
files can be committed and reviewed like ``dockerfiles/``.
"""

from __future__ import annotations

import re

from ...config.matrix import Entry

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def slug(text: str) -> str:
    """A name GitHub job ids and bake target names accept (letters, digits, _ and -)."""
    return _UNSAFE.sub("_", text)


def compile_group_name(entry: Entry) -> str:
    """The bake group of the entries that can share one kernel compile (see Entry.compile_group)."""
    return slug(f"compile-{entry.compile_group}")

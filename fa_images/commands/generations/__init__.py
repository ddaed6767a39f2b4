"""The commands a generation adds: ``source fa3``, the archive of a generation no index serves."""

from __future__ import annotations

from . import fa3_source

SOURCES = (fa3_source,)  # each one a `fa-images source NAME` subcommand

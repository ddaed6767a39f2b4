"""``build``'s command line, typed: the one place its defaults live. The parser (commands/build.py)
leaves a flag that was not given out of its namespace, so the default here applies; light to
import, as the parser imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ..config.grammar import BuilderChoice, PullPolicy


@dataclass(frozen=True, kw_only=True)
class BuildArgs:
    """``build``'s command line, typed; None where a flag was not given."""

    only: tuple[str, ...] | None = None
    wheels: tuple[Path, ...] | None = None
    published: str | None = None
    builder: BuilderChoice | None = None
    check: bool = True
    push: bool = False
    gpus: str = "runtime"
    compiler_cache: Path | None = None
    no_compiler_cache: bool = False
    pull: PullPolicy | None = None
    dist: Path = Path("dist")
    log_dir: Path = Path("logs")
    fail_fast: bool = False
    keep_container: bool = False
    keep_work: bool = False
    force: bool = False
    report: Path | None = None
    sign_key: Path | None = None
    statements: Path | None = None

    @classmethod
    def of(cls, parsed: Mapping[str, Any]) -> BuildArgs:
        """From the command line's parsed values (``vars`` of its namespace): each field by its
        name, a list as a tuple; values of other commands' flags are not read."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in parsed:
                value = parsed[f.name]
                values[f.name] = tuple(value) if isinstance(value, list) else value
        return cls(**values)

    def compiler_cache_root(self) -> Path | None:
        """Where each compile group's compiler cache is kept; None: nowhere (--no-compiler-cache)."""
        from ..outputs import context, group_cache

        if self.no_compiler_cache:
            return None
        return self.compiler_cache or group_cache.default_root(context.cache_dir())

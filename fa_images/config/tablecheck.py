"""Checking a table document (the compat table and its overrides): every problem collected with its
line, each value held to the grammar of where it goes (every value may reach a Dockerfile)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import Problem
from . import grammar, yamlfile


class Checker:
    """Collects every problem in a compat document instead of stopping at the first."""

    def __init__(self, doc: yamlfile.YamlDoc) -> None:
        self.doc = doc
        self.problems: list[Problem] = []

    def fail(self, path: tuple, message: str, hint: str | None = None) -> None:
        self.problems.append(self.doc.problem(path, message, hint=hint))

    def mapping(self, path: tuple, value: Any) -> dict:
        if not isinstance(value, dict):
            self.fail(path, f"{'.'.join(map(str, path))} must be a mapping")
            return {}
        return value

    def version(self, path: tuple, value: Any, check: Callable[[str], str | None] = grammar.version) -> str | None:
        """A string that follows ``check``'s grammar; everything here may reach a Dockerfile."""
        where = ".".join(map(str, path))
        if not isinstance(value, str):
            written = getattr(value, "text", value)
            self.fail(path, f"{where}: {written} must be a quoted string", hint=f'write "{written}"')
            return None
        problem = check(value)
        if problem:
            self.fail(path, f"{where}: {problem}")
            return None
        return value

    def key(self, path: tuple, value: Any, check: Callable[[str], str | None] = grammar.version) -> str | None:
        """A mapping key that names a version: quoted or not, it must follow its grammar."""
        text = str(getattr(value, "text", value))
        problem = check(text)
        if problem:
            self.fail(path, f"{'.'.join(map(str, path[:-1]))}: key {problem}")
            return None
        return text


def pins(c: Checker, path: tuple, tools: Any) -> tuple[str, ...]:
    """A list of ``name==version`` pins; each reaches a RUN line."""
    if not isinstance(tools, list):
        c.fail(path, f'{".".join(map(str, path))} must be a list of pins like "ninja==1.13.2"')
        return ()
    return tuple(t for i, t in enumerate(tools) if c.version((*path, i), t, grammar.pin))

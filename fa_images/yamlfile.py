"""Loads YAML and remembers the line of every key, so errors can point at it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError, Problem

Path_ = tuple[str | int, ...]


@dataclass
class YamlDoc:
    data: Any
    file: str
    lines: dict[Path_, int] = field(default_factory=dict)

    def line(self, path: Path_) -> int | None:
        """Line of ``path``, or of its nearest parent that has one."""
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return None

    def problem(self, path: Path_, message: str, *, entry: str | None = None, hint: str | None = None) -> Problem:
        return Problem(message, file=self.file, line=self.line(path), entry=entry, hint=hint)


def _record(node: yaml.Node, path: Path_, lines: dict[Path_, int]) -> None:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            sub = path + (str(key.value),)
            lines[sub] = key.start_mark.line + 1
            _record(value, sub, lines)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _record(item, path + (i,), lines)


def load(path: Path, *, what: str, hint: str = "pass --matrix FILE or create matrix.yaml") -> YamlDoc:
    """Parses ``path``; a missing, empty or malformed file is a ConfigError with its position."""
    shown = str(path)
    if not path.is_file():
        raise ConfigError([Problem(f"{what} not found", file=shown, hint=hint)])
    text = path.read_text()
    try:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            data = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        raise ConfigError(
            [
                Problem(
                    f"invalid YAML: {exc.problem}",
                    file=shown,
                    line=mark.line + 1 if mark else None,
                    hint=f"column {mark.column + 1}" if mark else None,
                )
            ]
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError([Problem(f"invalid YAML: {exc}", file=shown)]) from None
    if data is None:
        raise ConfigError([Problem(f"{what} is empty", file=shown)])
    if not isinstance(data, dict):
        raise ConfigError(
            [Problem(f"{what} must be a mapping at the top, not a {type(data).__name__}", file=shown, line=1)]
        )
    doc = YamlDoc(data=data, file=shown)
    _record(node, (), doc.lines)
    return doc

"""Loads YAML and remembers the line of every key, so errors can point at it."""

from __future__ import annotations

import functools
import pickle
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..builder import untrusted
from ..errors import ConfigError, Problem

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


# A matrix is a few kB; these bounds only stop hostile or broken files from exhausting
# memory (an alias "billion laughs" is a few hundred bytes) or the stack.
MAX_BYTES = 1 << 20
MAX_NODES = 100_000
MAX_DEPTH = 64
# libyaml's scanner has a depth limit of its own (PyYAML 6.0.4 on): a deeper file fails there,
# before MAX_DEPTH's check of the composed tree. Its words, as the scanner says them:
LIBYAML_TOO_DEEP = "exceeded maximum nesting depth"


def _event_parser(stream: str) -> Any:
    """libyaml's parser, in C, where PyYAML was built with it: six times faster than its own."""
    try:
        from yaml._yaml import CParser
    except ImportError:
        return None
    return CParser(stream)


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and counts every node an alias expands to.

    Its events come from libyaml where PyYAML has it; the nodes are still composed here, in
    Python, where a nest too deep ends in a RecursionError: libyaml's own composer recurses in C
    and crashes the process on one."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)  # its reader refuses some characters at once
        self._fast = _event_parser(stream)
        self.expanded = 0

    def check_event(self, *choices: Any) -> bool:
        return bool(self._fast.check_event(*choices)) if self._fast else super().check_event(*choices)

    def peek_event(self) -> yaml.Event:
        return self._fast.peek_event() if self._fast else super().peek_event()

    def get_event(self) -> yaml.Event:
        return self._fast.get_event() if self._fast else super().get_event()

    def dispose(self) -> None:
        super().dispose()
        if self._fast:
            self._fast.dispose()

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        self.expanded += 1
        if self.expanded > MAX_NODES:
            raise _TooLarge(f"it expands to more than {MAX_NODES} values (aliases that repeat each other?)")
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, OverflowError) as exc:  # a date that is none, `!!int "x"`, 5000 digits: here
            raise yaml.constructor.ConstructorError(None, None, untrusted.shown(str(exc)), node.start_mark) from None

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                raise yaml.constructor.ConstructorError(
                    None, None, f"a {type(key).__name__} cannot be a key", key_node.start_mark
                )
            if key in seen:
                raise _Duplicate(key, seen[key], key_node.start_mark.line + 1)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


class Number(float):
    """A float that remembers how it was written: ``3.10`` reads as 3.1, and the hint says "3.10"."""

    text: str


def _not_base_60(node: yaml.ScalarNode) -> None:
    """YAML 1.1 reads ``4:30`` as the number 270, and its conversion of a long ``1:2:3:...`` takes
    time quadratic in its length: a value with a colon is refused, not converted."""
    if ":" in node.value:
        raise yaml.constructor.ConstructorError(
            None, None, "a number with ':' is base 60 in YAML 1.1; quote it if it is text", node.start_mark
        )


def _construct_int(loader: _Loader, node: yaml.ScalarNode) -> int:
    _not_base_60(node)
    return yaml.SafeLoader.construct_yaml_int(loader, node)


def _construct_float(loader: _Loader, node: yaml.ScalarNode) -> float:
    _not_base_60(node)
    number = Number(yaml.SafeLoader.construct_yaml_float(loader, node))
    number.text = node.value
    return number


_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_Loader.add_constructor("tag:yaml.org,2002:float", _construct_float)


class _TooLarge(Exception):
    pass


class _Duplicate(Exception):
    def __init__(self, key: Any, first: int, line: int) -> None:
        super().__init__(key)
        self.key, self.first, self.line = key, first, line


def _check_shape(node: yaml.Node) -> None:
    """Refuses a tree that contains itself, nests too deep, or whose aliases expand too far.

    Iterative, so a hostile file cannot overflow the stack here either.
    """
    count = 0
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, int, bool]] = [(node, 1, True)]
    while stack:
        current, depth, entering = stack.pop()
        if not entering:
            on_path.discard(id(current))
            continue
        count += 1
        if count > MAX_NODES:
            raise _TooLarge(f"it expands to more than {MAX_NODES} values (aliases that repeat each other?)")
        if depth > MAX_DEPTH:
            raise _TooLarge(f"it nests too deeply (more than {MAX_DEPTH} levels)")
        if not isinstance(current, yaml.CollectionNode):
            continue
        if id(current) in on_path:
            raise _TooLarge("an alias refers to a node that contains it")
        on_path.add(id(current))
        stack.append((current, depth, False))
        children = current.value
        if isinstance(current, yaml.MappingNode):
            children = [n for pair in current.value for n in pair]
        stack += [(child, depth + 1, True) for child in children]


def _record(node: yaml.Node, path: Path_, lines: dict[Path_, int]) -> None:
    stack: list[tuple[yaml.Node, Path_]] = [(node, path)]
    while stack:
        current, where = stack.pop()
        lines.setdefault(where, current.start_mark.line + 1)
        if isinstance(current, yaml.MappingNode):
            for key, value in current.value:
                sub = where + (str(key.value),)
                lines[sub] = key.start_mark.line + 1
                stack.append((value, sub))
        elif isinstance(current, yaml.SequenceNode):
            stack += [(item, where + (i,)) for i, item in enumerate(current.value)]


def _type_name(value: Any) -> str:
    return "float" if isinstance(value, float) else type(value).__name__


def load(path: Path, *, what: str, hint: str = "pass --matrix FILE or create matrix.yaml") -> YamlDoc:
    """Parses ``path``; a missing, empty, oversized or malformed file is a ConfigError with its position."""
    shown = str(path)
    if not path.exists():
        raise ConfigError([Problem(f"{what} not found", file=shown, hint=hint)])
    try:  # a regular file only: a FIFO, a directory, a device is named as what it is
        raw = untrusted.read_file(path, limit=MAX_BYTES + 1, what=what)
    except untrusted.UntrustedInput as exc:
        raise ConfigError([Problem(str(exc), file=shown)]) from None
    return parse(raw, shown=shown, what=what)


def parse(raw: bytes, *, shown: str, what: str) -> YamlDoc:
    """Parses YAML bytes, as ``load`` does a file (``shown`` names it in errors). The same bytes
    parse to the same document: a process that reads the compat table for each entry and command
    parses it once, and each caller gets its own copy to change."""
    return pickle.loads(_parsed(raw, shown, what))


@functools.lru_cache(maxsize=16)  # keyed by the bytes themselves, each at most MAX_BYTES
def _parsed(raw: bytes, shown: str, what: str) -> bytes:
    return pickle.dumps(_parse(raw, shown=shown, what=what))


def _too_deep(what: str, shown: str) -> ConfigError:
    """A file deeper than a parser's stack or limit: libyaml's scanner, or PyYAML's composer."""
    return ConfigError([Problem(f"{what} is refused: it nests too deeply", file=shown)])


def _parse(raw: bytes, *, shown: str, what: str) -> YamlDoc:
    if len(raw) > MAX_BYTES:
        raise ConfigError([Problem(f"{what} is larger than {MAX_BYTES >> 10} KiB", file=shown)])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            [Problem(f"{what} is not UTF-8 text (byte {raw[exc.start]:#04x})", file=shown, line=line)]
        ) from None
    loader = None
    try:
        loader = _Loader(text)  # its reader already refuses some characters
        node = loader.get_single_node()
        if node is not None:
            _check_shape(node)
        data = loader.construct_document(node) if node is not None else None
    except _TooLarge as exc:
        raise ConfigError([Problem(f"{what} is refused: {exc}", file=shown)]) from None
    except _Duplicate as exc:
        raise ConfigError(
            [
                Problem(
                    f"key {exc.key!r} appears twice (first on line {exc.first}); YAML would keep only the last",
                    file=shown,
                    line=exc.line,
                    hint="merge the two blocks into one",
                )
            ]
        ) from None
    except yaml.MarkedYAMLError as exc:
        if exc.problem == LIBYAML_TOO_DEEP:
            raise _too_deep(what, shown) from None
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
    except RecursionError:
        raise _too_deep(what, shown) from None
    except yaml.YAMLError as exc:
        raise ConfigError([Problem(f"invalid YAML: {exc or type(exc).__name__}", file=shown)]) from None
    finally:
        if loader is not None:
            loader.dispose()
    if data is None:
        raise ConfigError([Problem(f"{what} is empty", file=shown)])
    if not isinstance(data, dict):
        raise ConfigError(
            [Problem(f"{what} must be a mapping at the top, not a {_type_name(data)}", file=shown, line=1)]
        )
    doc = YamlDoc(data=data, file=shown)
    assert node is not None  # data is a mapping, so there was a node
    _record(node, (), doc.lines)
    return doc

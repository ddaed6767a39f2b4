"""A matrix's axes, ``exclude``/``include`` rules and one-off ``entries`` -> combinations.

The rules are GitHub Actions': every combination of the axes, minus the excluded, then the
included (merged into the combinations they do not contradict, else added), then the entries.
An axis named by a rule (``torch: ">=2.9"``) takes the versions ``rules.py`` resolved it to.
A combination is still raw YAML values with the place it came from; ``resolve`` checks it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import Problem
from . import yamlfile
from .compat import did_you_mean

# Far more than any real matrix (the flash-attn project builds 56 wheels a release); it only
# stops a hostile or mistaken file from expanding into millions of entries.
MAX_COMBINATIONS = 10_000
AXES = ("python", "torch", "cuda", "flash_attn", "target", "archs", "ptx")
# The axes whose versions the compat table knows, which a rule may name (rules.py), and an example.
RULE_EXAMPLES = {"python": '">=3.10"', "torch": '">=2.9"', "cuda": '">=12.8"', "flash_attn": '"==2.8.*"'}
MATRIX_RULES = ("include", "exclude")
AXIS_EXAMPLES = {
    "python": '"3.12"',
    "torch": '"2.9.1"',
    "cuda": '"12.8"',
    "flash_attn": '"2.8.3"',
    "target": "aws",
    "archs": "80",
    "ptx": "false",
}


@dataclass
class Combo:
    values: dict[str, Any]
    origin: tuple  # path in the YAML, for error lines
    label: str
    key_origin: dict[str, tuple] = field(default_factory=dict)  # keys an include rule added
    # Axes whose value a rule chose: where the table has no such build, the combination is
    # left out rather than refused (resolve.EntryResolver.left_out).
    ruled: frozenset[str] = frozenset()


def as_written(value: Any) -> str:
    """A value as the file wrote it (an unquoted 3.10 stays 3.10)."""
    return str(getattr(value, "text", value))


def as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def kind(value: Any) -> str:
    """How a YAML value reads in an error line: 'a list ([])', 'the string \'false\''."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"the string {value!r}"
    # bool before int (True is an int), and a YAML float is yamlfile.Number, a float.
    kinds = ((bool, "a boolean"), (int, "a number"), (float, "a number"), (list, "a list"), (dict, "a mapping"))
    name = next((name for cls, name in kinds if isinstance(value, cls)), type(value).__name__)
    return f"{name} ({getattr(value, 'text', value)!r})"


def expand(
    doc: yamlfile.YamlDoc, problems: list[Problem], ruled: Mapping[str, tuple[str, ...] | None] | None = None
) -> list[Combo]:
    """Axes -> combinations, then exclude, then include (GitHub Actions rules), then entries.

    ``ruled``: the axes named by a rule, and the versions it resolved to (None: the rule was
    refused, its problem recorded)."""
    ruled = ruled or {}
    raw = _matrix_section(doc, problems)
    axes = _axes(doc, problems, raw, ruled)
    written = list(axes)
    axes, combos, broken = _combinations(doc, problems, axes, ruled)
    combos = _exclude(doc, problems, raw.get("exclude"), combos, written)
    product = _labelled(combos, frozenset(k for k in axes if k in ruled))
    return _include(doc, problems, raw.get("include"), product, axes, broken) + _entries(doc, problems)


def _matrix_section(doc: yamlfile.YamlDoc, problems: list[Problem]) -> dict:
    """The ``matrix:`` mapping; empty where there is none, or it is no mapping (reported)."""
    raw = doc.data.get("matrix")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.append(doc.problem(("matrix",), f"matrix must be a mapping of axes, not {kind(raw)}"))
        return {}
    return raw


def _axes(
    doc: yamlfile.YamlDoc, problems: list[Problem], raw: dict, ruled: Mapping[str, tuple[str, ...] | None]
) -> dict:
    """Every axis as written (a rule's: the versions it resolved to); an unknown or empty one is reported."""
    axes = {k: (list(ruled[k] or ()) if k in ruled else v) for k, v in raw.items() if k not in MATRIX_RULES}
    for key, values in axes.items():
        if key in ruled:
            continue  # a rule: rules.py has resolved it or said what is wrong with it
        if key not in AXES:
            problems.append(doc.problem(("matrix", key), f"unknown axis {key!r}", hint=did_you_mean(key, AXES)))
        elif not isinstance(values, list) or not values:
            rule = f", {key}: {RULE_EXAMPLES[key]} or {key}: {{newest: 2}}" if key in RULE_EXAMPLES else ""
            problems.append(
                doc.problem(
                    ("matrix", key),
                    f"axis {key!r} must be a non-empty list{' or a rule' if rule else ''}, not {kind(values)}",
                    hint=f"e.g. {key}: [{AXIS_EXAMPLES.get(key, '...')}]{rule}",
                )
            )
    return axes


def _combinations(
    doc: yamlfile.YamlDoc, problems: list[Problem], axes: dict, ruled: Mapping[str, tuple[str, ...] | None]
) -> tuple[dict, list[dict], bool]:
    """The usable axes, every combination of them, and whether the product was given up (broken:
    an include rule then adds no combination of its own)."""
    # A refused rule has said what is wrong with its axis: the product of the others is no
    # combination anyone wrote, and would only add "torch is missing" to each.
    broken = any(k in ruled and not v for k, v in axes.items())
    axes = {} if broken else {k: v for k, v in axes.items() if k in AXES and isinstance(v, list) and v}
    size = math.prod(len(v) for v in axes.values()) if axes else 0
    if size > MAX_COMBINATIONS:
        problems.append(
            doc.problem(
                ("matrix",), f"the axes expand to {size} combinations; fa-images builds at most {MAX_COMBINATIONS}"
            )
        )
        axes, broken = {}, True
    combos = [dict(zip(axes, values)) for values in itertools.product(*axes.values())] if axes else []
    return axes, combos, broken


def _exclude(
    doc: yamlfile.YamlDoc, problems: list[Problem], rules: Any, combos: list[dict], written: list
) -> list[dict]:
    """The combinations no exclude rule matches; a rule that names no written axis is reported, not applied."""
    for i, rule in enumerate(as_list(rules or [])):
        if not isinstance(rule, dict):
            problems.append(doc.problem(("matrix", "exclude", i), "each exclude rule must be a mapping"))
            continue
        bad = [k for k in rule if k not in written]
        if bad:
            problems.append(
                doc.problem(
                    ("matrix", "exclude", i),
                    f"exclude rule names {bad[0]!r}, which is not an axis",
                    hint=did_you_mean(bad[0], written),
                )
            )
            continue
        combos = [c for c in combos if not all(c.get(k) == v for k, v in rule.items())]
    return combos


def _labelled(combos: list[dict], by_rule: frozenset[str]) -> list[Combo]:
    """Each combination of the axes as a Combo named by its values, as the file wrote them."""
    return [
        Combo(
            c,
            ("matrix",),
            "matrix[" + ", ".join(f"{k}={as_written(v)}" for k, v in c.items()) + "]",
            ruled=by_rule,
        )
        for c in combos
    ]


def _include(
    doc: yamlfile.YamlDoc, problems: list[Problem], rules: Any, product: list[Combo], axes: dict, broken: bool
) -> list[Combo]:
    """``product`` with each include rule merged into every combination it does not contradict,
    and a rule that fits none added as a combination of its own (GitHub Actions' semantics).

    A rule is matched through an index of the combinations by the axis values it names, and
    what it adds is merged once per combination at the end: 20,000 rules over 10,000
    combinations is linear work, not 200 million comparisons."""
    out = list(product)
    index = _IncludeIndex(product, axes)
    for i, rule in enumerate(as_list(rules or [])):
        if not isinstance(rule, dict):
            problems.append(doc.problem(("matrix", "include", i), "each include rule must be a mapping"))
            continue
        if not index.add(i, rule) and not broken:
            out.append(Combo(dict(rule), ("matrix", "include", i), f"matrix.include[{i}]"))
    index.merge()
    return out


# What include rules wrote into the combinations of one index bucket: key -> (the first rule
# and place that wrote it, which orders the keys; the last rule and its value, which wins).
_Writes = dict[str, tuple[tuple[int, int], int, Any]]


@dataclass
class _Bucket:
    combos: list[Combo] = field(default_factory=list)
    writes: _Writes = field(default_factory=dict)


class _IncludeIndex:
    """The combinations by the values of each set of axes an include rule names; a rule is
    merged into a bucket, and each bucket into its combinations once (``merge``)."""

    def __init__(self, product: list[Combo], axes: dict) -> None:
        self._product, self._axes = product, axes
        self._by_names: dict[tuple, dict[tuple, _Bucket]] = {}

    def add(self, i: int, rule: dict) -> bool:
        """Records rule ``i``; whether any combination matches it (else it is a combination of its own)."""
        names = tuple(k for k in self._axes if k in rule)  # an added key never decides a match
        bucket = self._buckets(names).get(tuple(_hashable(rule[k]) for k in names))
        if bucket is None:
            return False
        added = [(k, v) for k, v in rule.items() if k not in self._axes]
        for place, (key, value) in enumerate(added):
            first = bucket.writes[key][0] if key in bucket.writes else (i, place)
            bucket.writes[key] = (first, i, value)
        return True

    def merge(self) -> None:
        """Each combination gets every key its buckets' rules wrote: the last rule's value, the
        keys in the order the rules first wrote them, as merging rule by rule would leave them."""
        merged: dict[int, _Writes] = {}
        for buckets in self._by_names.values():
            for bucket in buckets.values():
                for combo in bucket.combos if bucket.writes else ():
                    _combine(merged.setdefault(id(combo), {}), bucket.writes)
        for combo in self._product:
            writes = merged.get(id(combo), {})
            for key in sorted(writes, key=lambda k: writes[k][0]):
                _first, i, value = writes[key]
                combo.values[key] = value
                combo.key_origin[key] = ("matrix", "include", i, key)

    def _buckets(self, names: tuple) -> dict[tuple, _Bucket]:
        """The combinations by their values of the axes ``names``, indexed at the first rule naming them."""
        if names not in self._by_names:
            buckets: dict[tuple, _Bucket] = {}
            for combo in self._product:
                key = tuple(_hashable(combo.values[k]) for k in names)
                buckets.setdefault(key, _Bucket()).combos.append(combo)
            self._by_names[names] = buckets
        return self._by_names[names]


def _combine(into: _Writes, writes: _Writes) -> None:
    """One combination's writes from two buckets: the earliest first write, the latest value."""
    for key, (first, i, value) in writes.items():
        if key in into:
            first = min(first, into[key][0])
            if into[key][1] > i:
                i, value = into[key][1], into[key][2]
        into[key] = (first, i, value)


def _hashable(value: Any) -> Any:
    """A YAML value as a dict key, equal where the values are ``==``: NaN, which equals nothing,
    a key of its own; lists and mappings frozen (inside them, ``==`` takes the same NaN as equal)."""
    if isinstance(value, float) and value != value:
        return object()
    return _frozen(value)


def _frozen(value: Any) -> Any:
    if isinstance(value, (list, tuple)):  # a tuple: YAML's !!omap and !!pairs
        return (type(value), tuple(_frozen(v) for v in value))
    if isinstance(value, dict):
        return (dict, frozenset((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, (set, frozenset)):
        return (set, frozenset(value))
    return value


def _entries(doc: yamlfile.YamlDoc, problems: list[Problem]) -> list[Combo]:
    """The one-off ``entries:``, each a combination as written; one that is no mapping is reported."""
    entries = doc.data.get("entries")
    if entries is None:
        entries = []
    elif not isinstance(entries, list):
        problems.append(doc.problem(("entries",), f"entries must be a list of mappings, not {kind(entries)}"))
        entries = []
    out: list[Combo] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            problems.append(doc.problem(("entries", i), "each entry must be a mapping"))
            continue
        out.append(Combo(dict(entry), ("entries", i), f"entries[{i}]"))
    return out

"""Versions named by a rule on a matrix axis, resolved against the compat table.

An axis lists its values, as a CI matrix does. An axis whose versions the table knows (python,
torch, cuda, flash_attn) may instead name them by a rule: a PEP 440 specifier
(``torch: ">=2.9"``), the newest N (``torch: {newest: 3}``: for torch, the newest release of each
of the N newest series, since one wheel serves a series; for the other axes, N releases), or both
(``{versions: ">=2.9", newest: 2}``: the newest two the specifier admits). A rule is resolved
when the matrix is loaded, into the table's versions in version order, so what a matrix builds
changes only with the table: ``dockerfiles/`` and ``render --check`` stay deterministic for a
given table. Which combinations of the result the table has no build for is ``resolve.py``'s
question (``EntryResolver.left_out``).
"""

from __future__ import annotations

from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from ..errors import Problem
from . import grammar, yamlfile
from .compat import Compat, did_you_mean
from .expand import RULE_EXAMPLES, kind
from .model import ResolvedRule

RULE_KEYS = ("versions", "newest")
# Far more releases than a table holds of any axis; a larger number is a typo, not a wish.
MAX_NEWEST = 100
MAX_SPECIFIER = 200  # characters: ">=2.9,<2.12,!=2.10.0" is 20
WHAT = {"python": "Python", "torch": "torch release", "cuda": "CUDA version", "flash_attn": "flash-attn release"}


class BadRule(ValueError):
    """A rule the table cannot resolve: where in the rule (a key under the axis), what, and a hint."""

    def __init__(self, where: tuple, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.where, self.message, self.hint = where, message, hint


def is_rule(axis: str, value: Any) -> bool:
    """Whether an axis value is a rule rather than a list: a specifier string or a mapping."""
    return axis in RULE_EXAMPLES and isinstance(value, (str, dict))


def table_versions(axis: str, compat: Compat) -> tuple[str, ...]:
    """The versions of the table a rule on ``axis`` chooses from."""
    known = {
        "python": compat.pythons,
        "torch": tuple(compat.torch),
        "cuda": tuple(compat.cuda),
        "flash_attn": tuple(compat.flash_attn),
    }
    return known[axis]


def resolve_axes(doc: yamlfile.YamlDoc, compat: Compat, problems: list[Problem]) -> dict[str, ResolvedRule | None]:
    """Each rule axis of ``matrix:`` -> what it resolves to; None for one refused (its problem recorded)."""
    raw = doc.data.get("matrix")
    if not isinstance(raw, dict):
        return {}
    out: dict[str, ResolvedRule | None] = {}
    for axis, value in raw.items():
        if not is_rule(str(axis), value):
            continue
        try:
            out[axis] = resolve(axis, value, compat)
        except BadRule as bad:
            problems.append(doc.problem(("matrix", axis, *bad.where), bad.message, hint=bad.hint))
            out[axis] = None
    return out


def resolve(axis: str, value: str | dict, compat: Compat) -> ResolvedRule:
    """One rule -> the table's versions it names, oldest first; BadRule for a rule that names none."""
    where = f"matrix.{axis}"
    spec: SpecifierSet | None
    if isinstance(value, str):
        versions: str | None = value
        newest = None
        spec = _specifier(axis, (), where, value)
    else:
        for key in value:
            if key not in RULE_KEYS:
                raise BadRule((key,), f"unknown key {_clipped(key)} in {where}", hint=did_you_mean(str(key), RULE_KEYS))
        if not value:
            raise BadRule((), f"{where} is an empty rule", hint=_example(axis))
        versions = value.get("versions")
        spec = _specifier(axis, ("versions",), f"{where}.versions", versions) if "versions" in value else None
        newest = _newest(f"{where}.newest", value["newest"]) if "newest" in value else None
    known = table_versions(axis, compat)
    # Pre-releases only where the specifier names one (PEP 440's default), whatever the
    # packaging release's own default: a table's rc is not among the "newest releases".
    admits = spec.prereleases is True if spec is not None else False
    chosen = [
        v for v in known if (admits or not Version(v).is_prerelease) and (spec is None or spec.contains(v, admits))
    ]
    chosen.sort(key=Version)
    if newest is not None:
        chosen = _newest_series(chosen, newest) if axis == "torch" else chosen[-newest:]
    rule = ResolvedRule(axis=axis, versions=versions, newest=newest, values=tuple(chosen))
    if not chosen:
        raise BadRule(
            (),
            f"{where} {rule} matches no {WHAT[axis]} of the compat table",
            hint=f"it knows {', '.join(sorted(known, key=Version)) or 'none'}",
        )
    return rule


def _newest_series(versions: list[str], count: int) -> list[str]:
    """The newest release of each of the ``count`` newest torch series: one wheel serves a series
    (flash-attn labels it +...torch2.9...), so `{newest: 3}` is three wheels, not three releases."""
    newest_of: dict[tuple[int, int], str] = {}
    for version in versions:  # oldest first: the last of a series is its newest
        release = Version(version).release
        newest_of[(release[0], release[1] if len(release) > 1 else 0)] = version
    return list(newest_of.values())[-count:]


def _specifier(axis: str, key: tuple, where: str, value: Any) -> SpecifierSet:
    if not isinstance(value, str):
        raise BadRule(key, f"{where} must be a quoted version specifier, not {kind(value)}", hint=_example(axis))
    if len(value) > MAX_SPECIFIER:
        raise BadRule(key, f"{where} is a specifier of {len(value)} characters; at most {MAX_SPECIFIER}")
    if not value.strip():
        raise BadRule(key, f"{where} is an empty specifier, which would take every release", hint=_example(axis))
    try:
        return SpecifierSet(value)
    except InvalidSpecifier:
        pass
    if grammar.version(value.strip()) is None:  # one version, written where a rule goes
        hint = f'one version is a list of one: {axis}: ["{value.strip()}"]; or "=={value.strip()}"'
    else:
        hint = 'a PEP 440 specifier such as ">=2.9", ">=2.9,<2.12" or "==2.9.*"'
    raise BadRule(key, f"{where} {_clipped(value)} is not a version specifier", hint=hint)


def _newest(where: str, value: Any) -> int:
    # bool is an int in Python, and a YAML `true` is no count.
    if type(value) is not int or not 1 <= value <= MAX_NEWEST:
        shown = kind(value) if type(value) is not int or abs(value) < 10**12 else "a number too large"
        raise BadRule(("newest",), f"{where} must be a whole number from 1 to {MAX_NEWEST}, not {shown}")
    return value


def _clipped(value: Any, length: int = 60) -> str:
    """A value as an error line quotes it: repr'd, never longer than ``length``."""
    text = repr(value) if isinstance(value, str) else repr(str(value))
    return text if len(text) <= length else text[: length - 1] + "…"


def _example(axis: str) -> str:
    spec = RULE_EXAMPLES[axis]
    return f"e.g. {axis}: {spec}, {axis}: {{newest: 2}} or {axis}: {{versions: {spec}, newest: 2}}"

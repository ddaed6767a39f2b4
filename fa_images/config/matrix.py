"""matrix.yaml -> frozen, validated build entries.

The file is written the way CI matrices are: axes that expand into every combination,
``exclude`` and ``include`` rules with GitHub Actions semantics, named GPU targets, and
only then one-off ``entries``. Code past this module never sees raw dicts. Every problem
is collected, with its file and line, and reported together.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from packaging.version import Version

from ..builder.errors import UsageError
from ..builder.settings import gpu_class
from ..builder.wording import counted
from ..errors import ConfigError, Problem, dedupe
from . import compat as compat_mod
from . import generations, grammar, rules, yamlfile
from .compat import did_you_mean
from .expand import AXES, MAX_COMBINATIONS, Combo, as_list, expand, kind
from .model import DEFAULT_IMAGE, Bases, BuildOptions, Entry, LeftOut, Matrix, Packages, ResolvedRule
from .resolve import PLACEHOLDERS, EntryResolver, fill_placeholders

__all__ = ["AXES", "MAX_COMBINATIONS", "Entry", "Matrix", "expand", "fill_placeholders", "load", "top_keys"]


def top_keys() -> tuple[str, ...]:
    """The top-level keys: the matrix's own, and each generation's own section, in that order."""
    own = ("image", "targets", "matrix", "entries", "bases", "packages", "build")
    return (*own, *(section.key for section in generations.sections()), "compat", "allow_unknown")


TARGETS_EXAMPLE = "e.g. targets: {aws: [A10G, L4]}"
# The grammar each setting must follow before it may reach a Dockerfile or the engine.
SETTING_GRAMMAR: dict[tuple[str, str], Callable[[str], str | None]] = {
    ("bases", "devel"): grammar.image_reference,
    ("bases", "runtime"): grammar.image_reference,
    ("bases", "uv_version"): grammar.version,
    ("bases", "python_mirror"): grammar.url_without_login,  # written into the Dockerfile as it is
    ("packages", "index"): grammar.index_url,
    ("packages", "torch_index"): grammar.index_url,
    ("packages", "find_links"): grammar.find_links,
    ("packages", "flash_attn_index"): grammar.index_url,
    ("build", "network"): grammar.network,
    ("build", "memory"): grammar.memory,
    ("build", "pull"): grammar.pull_policy,
    ("build", "builder"): grammar.builder_choice,
}
TEMPLATED = {("bases", "devel"), ("bases", "runtime"), ("packages", "torch_index")}


def _setting_problem(key: str, name: str, value: Any) -> str | None:
    """What is wrong with one setting's value, or None."""
    check = SETTING_GRAMMAR.get((key, name))
    if not isinstance(value, str):
        return None
    if not value.isprintable():
        return f"{key}.{name} holds a control character (a newline would add a Dockerfile instruction)"
    if (key, name) in TEMPLATED:
        try:
            value = fill_placeholders(value, PLACEHOLDERS)
        except ValueError as exc:
            return f"{key}.{name} has a bad placeholder: {exc}"
    else:
        if "{" in value or "}" in value:
            return f"{key}.{name} may not use placeholders or braces"
    problem = check(value) if check else None
    return f"{key}.{name} {problem}" if problem else None


def _section(doc: yamlfile.YamlDoc, key: str, cls: Any, problems: list[Problem]) -> Any:
    """One optional settings section -> its frozen dataclass, with every bad key reported."""
    raw = doc.data.get(key)
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        problems.append(doc.problem((key,), f"{key} must be a mapping, not {kind(raw)}"))
        return cls()
    defaults = cls()
    clean = {}
    for name, value in raw.items():
        if name not in cls.__dataclass_fields__:
            problems.append(
                doc.problem(
                    (key, name),
                    f"unknown key {key}.{name}",
                    hint=did_you_mean(str(name), list(cls.__dataclass_fields__)),
                )
            )
            continue
        default = getattr(defaults, name)
        if isinstance(default, tuple) and value is not None:
            value = tuple(as_list(value))  # one string is a list of one, not of its characters
        if value is None and "None" not in str(cls.__dataclass_fields__[name].type):
            problems.append(doc.problem((key, name), f"{key}.{name} may not be null (default: {default!r})"))
            continue
        wanted = type(default) if default is not None else str
        items = value if isinstance(value, tuple) else (value,)
        typed = isinstance(value, wanted) and (wanted is not tuple or all(isinstance(v, str) for v in value))
        if value is not None and not typed:
            what = "list of strings" if wanted is tuple else {"str": "string", "bool": "true or false"}[wanted.__name__]
            problems.append(doc.problem((key, name), f"{key}.{name} must be a {what}, not {kind(value)}"))
            continue
        bad = next((p for p in (_setting_problem(key, name, v) for v in items) if p), None)
        if bad:
            problems.append(doc.problem((key, name), bad))
            continue
        clean[name] = value
    if key == "bases" and clean.get("python", "uv") not in ("uv", "system"):
        problems.append(doc.problem((key, "python"), f"bases.python must be uv or system, not {clean['python']!r}"))
        clean.pop("python")
    return cls(**clean)


def _missing_hint(path: Path) -> str:
    """Where a first run starts: `fa-images init` writes a starter matrix (this machine, or a target)."""
    out = "" if path == Path("matrix.yaml") else f" --out {shlex.quote(str(path))}"
    return (
        f"`fa-images init{out}` writes a starter for this machine, `fa-images init --target aws{out}` one for "
        "AWS G5/G6; or pass --matrix FILE"
    )


def wheel_name_key(entry: Entry) -> tuple[str, str, str]:
    """What an entry's wheel is named by: flash-attn labels a wheel by the torch series it runs
    with (``+cu128torch2.9cxx11abitrue``), so two torch releases of one series make one name.
    A generation's shared wheel (an abi3 one) is its compile group's, by design: each entry is its own."""
    if entry.recipe.shares_wheel():
        return (entry.flash_attn, entry.id, entry.compile_group)
    return (entry.flash_attn, entry.python, entry.wheel_label() or entry.id)


def _one_wheel_per_name(builder: EntryResolver, made: list[tuple[Entry, Combo]]) -> list[Entry]:
    """The entries, one per wheel name: dist/ holds one file of a name, and a published one is
    never replaced. Of torch releases of one series that rules chose, the newest stays and the
    others are left out; one written by hand is refused."""
    by_name: dict[tuple[str, str, str], list[tuple[Entry, Combo]]] = {}
    for entry, combo in made:
        by_name.setdefault(wheel_name_key(entry), []).append((entry, combo))
    kept: set[str] = set()
    for same in by_name.values():
        newest, newest_combo = max(same, key=lambda pair: Version(pair[0].torch))
        kept.add(newest.id)
        series = ".".join(newest.torch.split(".")[:2])
        for entry, combo in same:
            if entry is newest:
                continue
            if "torch" in combo.ruled and "torch" in newest_combo.ruled:
                reason = f"torch {newest.torch} is newer in the {series} series, and one wheel serves a series"
                builder.left_out.append(LeftOut(combination=combo.label, reason=reason))
                continue
            builder.fail(
                combo,
                "torch",
                f"{entry.id} and {newest.id} would make the same wheel: flash-attn names a wheel by its torch "
                f"series (torch{series}), and dist/ holds one file of a name",
                hint=f"keep one torch {series}.x: the wheel of either runs with every torch {series} release",
            )
    return [entry for entry, _ in made if entry.id in kept]


def load(path: Path, *, compat_override: Path | None = None) -> Matrix:
    """Parses and validates ``path``; ``compat_override`` is merged after the matrix's own ``compat:``."""
    doc = yamlfile.load(path, what="matrix file", hint=_missing_hint(path))
    problems: list[Problem] = []
    _check_top_keys(doc, problems)
    compat = _compat_table(doc, path, compat_override, problems)
    image = _image(doc, problems)
    targets = _targets(doc, problems)
    allow_unknown = _allow_unknown(doc, problems)
    builder = EntryResolver(
        doc,
        compat,
        problems,
        targets=targets,
        image=image,
        bases=_section(doc, "bases", Bases, problems),
        packages=_section(doc, "packages", Packages, problems),
        build=_section(doc, "build", BuildOptions, problems),
        allow_unknown=allow_unknown,
        settings={section.key: _generation_section(doc, problems, section) for section in generations.sections()},
    )
    resolved = rules.resolve_axes(doc, compat, problems)
    combos = expand(doc, problems, {axis: rule.values if rule else None for axis, rule in resolved.items()})
    entries = _entries(doc, builder, combos, problems)
    if problems:
        raise ConfigError(dedupe(problems))
    return _matrix(path, image, entries, builder, compat, resolved)


def _check_top_keys(doc: yamlfile.YamlDoc, problems: list[Problem]) -> None:
    for key in doc.data:
        if key not in top_keys():
            problems.append(doc.problem((key,), f"unknown key {key!r}", hint=did_you_mean(key, top_keys())))


def _compat_file(doc: yamlfile.YamlDoc, path: Path, problems: list[Problem]) -> Path | None:
    """The matrix's own ``compat:`` file, beside the matrix."""
    compat_file = doc.data.get("compat")
    if compat_file is not None and not (isinstance(compat_file, str) and compat_file):
        problems.append(doc.problem(("compat",), f"compat must be a file path, not {kind(compat_file)}"))
        return None
    if compat_file and not grammar.printable(compat_file):  # a NUL is no path the system can open
        problems.append(doc.problem(("compat",), f"compat {compat_file!r} holds a control character"))
        return None
    return (path.parent / compat_file).resolve() if compat_file else None


def compat_file_of(path: Path) -> Path | None:
    """The ``compat:`` file a matrix names, read without the rest of the matrix (whose versions
    the table may not hold yet: `compat refresh` writes that file)."""
    doc = yamlfile.load(path, what="matrix file", hint=_missing_hint(path))
    problems: list[Problem] = []
    found = _compat_file(doc, path, problems)
    if problems:
        raise ConfigError(problems)
    return found


def _compat_table(
    doc: yamlfile.YamlDoc, path: Path, compat_override: Path | None, problems: list[Problem]
) -> compat_mod.Compat:
    """The built-in table, then the matrix's own ``compat:`` file (beside the matrix), then the override."""
    compat_file = _compat_file(doc, path, problems)
    overrides = [compat_file] if compat_file else []
    return compat_mod.load(*overrides, *([compat_override] if compat_override else []))


def _image(doc: yamlfile.YamlDoc, problems: list[Problem]) -> str:
    """The image repository the entries are tagged into; the default where it is bad (reported)."""
    image = doc.data.get("image", DEFAULT_IMAGE)
    bad_image = grammar.repository(image) if isinstance(image, str) else f"must be a string, not {kind(image)}"
    if bad_image:
        problems.append(
            doc.problem(
                ("image",),
                f"image {image!r} {bad_image}",
                hint="e.g. ghcr.io/acme/flash-attn (lower case, no tag: tags come from the entries)",
            )
        )
        return DEFAULT_IMAGE
    return image


def _targets(doc: yamlfile.YamlDoc, problems: list[Problem]) -> dict[str, list[str]]:
    """Each named GPU target and its GPUs; a target that is no list of names is reported and dropped."""
    targets = doc.data.get("targets")
    if targets is None:
        targets = {}
    elif not isinstance(targets, dict):
        problems.append(
            doc.problem(
                ("targets",), f"targets must map names to lists of GPUs, not {kind(targets)}", hint=TARGETS_EXAMPLE
            )
        )
        targets = {}
    for name, gpus in list(targets.items()):
        if not (isinstance(gpus, list) and gpus and all(isinstance(g, str) and g for g in gpus)):
            problems.append(
                doc.problem(
                    ("targets", name), f"target {name!r} must be a non-empty list of GPU names", hint=TARGETS_EXAMPLE
                )
            )
            del targets[name]
    return {str(k): list(v) for k, v in targets.items()}


def _generation_section(doc: yamlfile.YamlDoc, problems: list[Problem], section: generations.Section) -> Any:
    """A generation's own section -> its frozen settings, every bad key reported; its fields:
    each key's shape, a list of one type (``[int]``) or one number (``int``)."""
    key, cls, fields, example = section.key, section.settings, section.fields, section.example
    raw = doc.data.get(key)
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        problems.append(doc.problem((key,), f"{key} must be a mapping, not {kind(raw)}", hint=example))
        return cls()
    values: dict[str, Any] = {}
    for name, value in raw.items():
        shape = fields.get(name)
        if shape is None:
            hint = did_you_mean(str(name), list(fields))
            problems.append(doc.problem((key, name), f"unknown key {key}.{name}", hint=hint))
            continue
        listed = isinstance(shape, list)
        item = shape[0] if listed else shape
        got = tuple(as_list(value)) if listed else (value,)
        if not got or not all(isinstance(v, item) and (item is bool) == isinstance(v, bool) for v in got):
            what = {int: "numbers", str: "names", bool: "true or false"}[item] if listed else "a number"
            problems.append(
                doc.problem((key, name), f"{key}.{name} must be {'a list of ' * listed}{what}", hint=example)
            )
            continue
        values[name] = got if listed else value
    try:
        return cls(**values)
    except UsageError as exc:
        problems.append(doc.problem((key,), str(exc), hint=example))
        return cls()


def _allow_unknown(doc: yamlfile.YamlDoc, problems: list[Problem]) -> bool:
    allow_unknown = doc.data.get("allow_unknown", False)
    if not isinstance(allow_unknown, bool):
        problems.append(
            doc.problem(("allow_unknown",), f"allow_unknown must be true or false, not {kind(allow_unknown)}")
        )
        return False
    return allow_unknown


def _entries(
    doc: yamlfile.YamlDoc, builder: EntryResolver, combos: list[Combo], problems: list[Problem]
) -> list[Entry]:
    """The entries the combinations make, each once and one per wheel name; none at all is a problem."""
    if not combos and not problems:
        problems.append(doc.problem(("matrix",), "the matrix expands to no entries"))
    entries = _one_wheel_per_name(builder, _distinct_entries(builder, combos))
    if not entries and builder.left_out and not problems:
        first, more = builder.left_out[0], len(builder.left_out) - 1
        problems.append(
            doc.problem(
                ("matrix",),
                f"the matrix expands to no entries: the compat table has no build of its "
                f"{counted(len(builder.left_out), 'combination')}",
                hint=f"{first.combination}: {first.reason}" + (f", and {more} more" if more else ""),
            )
        )
    return entries


def _distinct_entries(builder: EntryResolver, combos: list[Combo]) -> list[tuple[Entry, Combo]]:
    """Each combination's entry, with the combination it came from; a second one of an id is refused.
    Where two entries differ in their archs alone (a target axis of several GPU classes), every
    entry is named by its GPU class: one image and one wheel per class, side by side."""
    resolved = [(entry, combo) for combo in combos if (entry := builder.entry(combo)) is not None]
    archs_of: dict[str, set[tuple[str, ...]]] = {}
    for entry, _ in resolved:
        archs_of.setdefault(entry.id, set()).add(entry.archs)
    if any(len(archs) > 1 for archs in archs_of.values()):
        resolved = [(named, combo) for entry, combo in resolved if (named := builder.by_gpu_class(entry, combo))]
    made: list[tuple[Entry, Combo]] = []
    seen: dict[str, str] = {}
    for entry, combo in resolved:
        if entry.id in seen:
            by_target = "target" in combo.values  # two targets of one GPU class: one entry, written twice
            one_class = f": both are GPU class {gpu_class(entry.archs)}" if by_target else ""
            builder.fail(
                combo,
                None,
                f"expands to {entry.id}, which {seen[entry.id]} already builds{one_class}",
                hint="name GPUs of one class in one target value, e.g. target: [[g5, g6e], g7e]"
                if by_target
                else "remove one, or change an exclude/include rule",
            )
            continue
        seen[entry.id] = combo.label
        made.append((entry, combo))
    return made


def _matrix(
    path: Path,
    image: str,
    entries: list[Entry],
    builder: EntryResolver,
    compat: compat_mod.Compat,
    resolved: dict[str, ResolvedRule | None],
) -> Matrix:
    """The validated matrix; its ``sdists`` dir is resolved beside the matrix file."""
    packages = builder.packages
    if packages.sdists:
        packages = replace(packages, sdists=str((path.parent / packages.sdists).resolve()))
    return Matrix(
        file=str(path),
        image=image,
        entries=tuple(entries),
        bases=builder.bases,
        packages=packages,
        build=builder.build_opts,
        compat=compat,
        rules=tuple(rule for rule in resolved.values() if rule),
        left_out=tuple(builder.left_out),
    )

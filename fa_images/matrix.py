"""matrix.yaml -> frozen, validated build entries.

The file is written the way CI matrices are: axes that expand into every combination,
``exclude`` and ``include`` rules with GitHub Actions semantics, named GPU targets, and
only then one-off ``entries``. Code past this module never sees raw dicts. Every problem
is collected, with its file and line, and reported together.
"""

from __future__ import annotations

import itertools
import math
import string
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from packaging.version import Version

from . import compat as compat_mod
from . import grammar, yamlfile
from .builder import contract
from .builder.settings import parse_archs
from .builder.source import PYPI_SIMPLE
from .compat import Compat, did_you_mean
from .errors import ConfigError, Problem, dedupe

TOP_KEYS = ("image", "targets", "matrix", "entries", "bases", "packages", "build", "compat", "allow_unknown")
# Far more than any real matrix (the flash-attn project builds 56 wheels a release); it only
# stops a hostile or mistaken file from expanding into millions of entries.
MAX_COMBINATIONS = 10_000
AXES = ("python", "torch", "cuda", "flash_attn", "target", "archs", "ptx")
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
DEFAULT_IMAGE = "fa-images/flash-attn"
TARGETS_EXAMPLE = "e.g. targets: {aws: [A10G, L4]}"


@dataclass(frozen=True, kw_only=True)
class Bases:
    """Base images; ``{cuda_release}`` etc. are filled per entry. Point them at a mirror offline."""

    devel: str = "nvidia/cuda:{cuda_release}-devel-ubuntu22.04"
    runtime: str = "nvidia/cuda:{cuda_release}-base-ubuntu22.04"
    python: str = "uv"  # "uv": install the exact Python; "system": the base has python3.X already
    uv_version: str = "0.9.5"
    # Where uv downloads CPython from (UV_PYTHON_INSTALL_MIRROR): a mirror of
    # python-build-standalone's releases, for sites that cannot reach GitHub.
    python_mirror: str | None = None


@dataclass(frozen=True, kw_only=True)
class Packages:
    index: str | None = "https://pypi.org/simple"  # None: no index at all (offline)
    torch_index: str | None = "https://download.pytorch.org/whl/{cuda_tag}"  # None: take torch from `index`
    find_links: tuple[str, ...] = ()
    flash_attn_index: str = PYPI_SIMPLE
    # A directory on the host searched first for flash_attn-VERSION.tar.gz: offline networks
    # and private sources. Relative to the matrix file.
    sdists: str | None = None


@dataclass(frozen=True, kw_only=True)
class BuildOptions:
    network: str | None = None  # docker build network mode; "host" reaches services on 127.0.0.1
    ptx: bool = False
    # The memory the compile may use (e.g. "16g"): a limit on the build's containers, which the
    # builder reads from its cgroup and sizes its parallel jobs by. None: the engine's whole memory.
    memory: str | None = None

    @property
    def memory_bytes(self) -> int | None:
        return grammar.memory_bytes(self.memory) if self.memory else None


@dataclass(frozen=True, kw_only=True)
class Entry:
    id: str
    python: str
    torch: str
    cuda: str
    cuda_release: str
    flash_attn: str
    archs: tuple[str, ...]
    ptx: bool
    gpus: tuple[str, ...]
    cxx11_abi: bool | None  # None: a torch the compat table does not know (allow_unknown)
    sdist_sha256: str | None
    image: str
    devel_image: str
    runtime_image: str
    torch_index: str | None

    @property
    def cuda_tag(self) -> str:
        return contract.cuda_tag(self.cuda)

    @property
    def compile_group(self) -> str:
        """Entries that differ only in Python share their kernels: no kernel includes Python.h.

        The devel base is a function of the CUDA version within one matrix, so it is covered.
        """
        archs = "_".join(self.archs) + ("-ptx" if self.ptx else "")
        return f"fa{self.flash_attn}-torch{self.torch}-{self.cuda_tag}-sm{archs}"

    @property
    def builder_image(self) -> str:
        """The builder stage, tagged so `docker image prune` cannot drop the compile's cache."""
        return f"{self.image}-builder"

    def summary(self) -> dict[str, Any]:
        data = asdict(self)
        data["archs"] = list(self.archs)
        data["group"] = self.compile_group
        if self.torch_index:
            data["torch_index"] = grammar.without_credentials(self.torch_index)
        data["gpus"] = list(self.gpus)
        return data


@dataclass(frozen=True, kw_only=True)
class Matrix:
    file: str
    image: str
    entries: tuple[Entry, ...]
    bases: Bases
    packages: Packages
    build: BuildOptions
    compat: Compat = field(repr=False)

    def select(self, ids: list[str] | None) -> tuple[Entry, ...]:
        if not ids:
            return self.entries
        known = {e.id for e in self.entries}
        unknown = [i for i in ids if i not in known]
        if unknown:
            raise ConfigError(
                [
                    Problem(
                        f"--only {unknown[0]!r} is not an entry of this matrix",
                        file=self.file,
                        hint=did_you_mean(unknown[0], sorted(known)),
                    )
                ]
            )
        return tuple(e for e in self.entries if e.id in ids)


@dataclass
class _Combo:
    values: dict[str, Any]
    origin: tuple  # path in the YAML, for error lines
    label: str
    key_origin: dict[str, tuple] = field(default_factory=dict)  # keys an include rule added


def _text(value: Any) -> str:
    """A value as the file wrote it (an unquoted 3.10 stays 3.10)."""
    return str(getattr(value, "text", value))


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def expand(doc: yamlfile.YamlDoc, problems: list[Problem]) -> list[_Combo]:
    """Axes -> combinations, then exclude, then include (GitHub Actions rules), then entries."""
    raw = doc.data.get("matrix")
    if raw is None:
        raw = {}
    elif not isinstance(raw, dict):
        problems.append(doc.problem(("matrix",), f"matrix must be a mapping of axes, not {_kind(raw)}"))
        raw = {}
    axes = {k: v for k, v in raw.items() if k not in MATRIX_RULES}
    for key, values in axes.items():
        if key not in AXES:
            problems.append(doc.problem(("matrix", key), f"unknown axis {key!r}", hint=did_you_mean(key, AXES)))
        elif not isinstance(values, list) or not values:
            problems.append(
                doc.problem(
                    ("matrix", key),
                    f"axis {key!r} must be a non-empty list, not {_kind(values)}",
                    hint=f"e.g. {key}: [{AXIS_EXAMPLES.get(key, '...')}]",
                )
            )
    axes = {k: v for k, v in axes.items() if k in AXES and isinstance(v, list) and v}
    size = math.prod(len(v) for v in axes.values()) if axes else 0
    if size > MAX_COMBINATIONS:
        problems.append(
            doc.problem(
                ("matrix",), f"the axes expand to {size} combinations; fa-images builds at most {MAX_COMBINATIONS}"
            )
        )
        axes, size = {}, 0
    combos = [dict(zip(axes, values)) for values in itertools.product(*axes.values())] if axes else []

    for i, rule in enumerate(_as_list(raw.get("exclude") or [])):
        if not isinstance(rule, dict):
            problems.append(doc.problem(("matrix", "exclude", i), "each exclude rule must be a mapping"))
            continue
        bad = [k for k in rule if k not in axes]
        if bad:
            problems.append(
                doc.problem(
                    ("matrix", "exclude", i),
                    f"exclude rule names {bad[0]!r}, which is not an axis",
                    hint=did_you_mean(bad[0], list(axes)),
                )
            )
            continue
        combos = [c for c in combos if not all(c.get(k) == v for k, v in rule.items())]

    out = [_Combo(c, ("matrix",), "matrix[" + ", ".join(f"{k}={_text(v)}" for k, v in c.items()) + "]") for c in combos]
    for i, rule in enumerate(_as_list(raw.get("include") or [])):
        if not isinstance(rule, dict):
            problems.append(doc.problem(("matrix", "include", i), "each include rule must be a mapping"))
            continue
        merged = False
        for combo in out[: len(combos)]:
            # Added only where it overwrites none of the combination's original axis values.
            if all(combo.values.get(k) == v for k, v in rule.items() if k in axes):
                for k, v in rule.items():
                    if k not in axes:
                        combo.values[k] = v
                        combo.key_origin[k] = ("matrix", "include", i, k)
                merged = True
        if not merged:
            out.append(_Combo(dict(rule), ("matrix", "include", i), f"matrix.include[{i}]"))

    entries = doc.data.get("entries")
    if entries is None:
        entries = []
    elif not isinstance(entries, list):
        problems.append(doc.problem(("entries",), f"entries must be a list of mappings, not {_kind(entries)}"))
        entries = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            problems.append(doc.problem(("entries", i), "each entry must be a mapping"))
            continue
        out.append(_Combo(dict(entry), ("entries", i), f"entries[{i}]"))
    return out


class _EntryBuilder:
    def __init__(
        self,
        doc: yamlfile.YamlDoc,
        compat: Compat,
        problems: list[Problem],
        *,
        targets: dict[str, list[str]],
        image: str,
        bases: Bases,
        packages: Packages,
        build: BuildOptions,
        allow_unknown: bool,
    ) -> None:
        self.doc, self.compat, self.problems = doc, compat, problems
        self.targets, self.image, self.bases, self.packages = targets, image, bases, packages
        self.build_opts, self.allow_unknown = build, allow_unknown

    def _fail(self, combo: _Combo, key: str | None, message: str, hint: str | None = None) -> None:
        path = combo.key_origin.get(key or "", combo.origin + ((key,) if key else ()))
        self.problems.append(self.doc.problem(path, message, entry=combo.label, hint=hint))

    def _version(self, combo: _Combo, key: str) -> str | None:
        value = combo.values.get(key)
        if value is None:
            self._fail(combo, key, f"{key} is missing")
            return None
        if not isinstance(value, str):
            written = _text(value)
            hint = f'write {key}: "{written}"'
            if isinstance(value, float) and written != str(value):
                hint += f"; YAML reads an unquoted {written} as the number {value}"
            self._fail(combo, key, f"{key} {written} must be a quoted string", hint=hint)
            return None
        problem = VERSION_GRAMMAR[key](value)
        if problem:
            self._fail(combo, key, f"{key} {problem}")
            return None
        return value

    def _known(self, combo: _Combo, key: str, value: str, known: list[str], what: str) -> bool:
        if value in known:
            return True
        if self.allow_unknown:
            return True
        self._fail(
            combo,
            key,
            f"{what} {value} is not in the compat table",
            hint=f"{did_you_mean(value, known) if value[:1].isalpha() else 'known: ' + ', '.join(known)}; "
            "add it with --compat FILE, or set allow_unknown: true",
        )
        return False

    def archs_for(self, combo: _Combo) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
        """(archs, GPU names) from `archs` or from `target` names."""
        if "archs" in combo.values:
            try:
                text = ",".join(map(str, _as_list(combo.values["archs"])))
                return parse_archs(text, known=self.compat.arch_codes), ()
            except ValueError as exc:
                self._fail(combo, "archs", str(exc))
                return None
        if "target" not in combo.values:
            self._fail(
                combo,
                None,
                "no target and no archs: name the GPUs it is for",
                hint="e.g. target: aws (a name under targets:) or archs: [80]",
            )
            return None
        gpus: list[str] = []
        for name in _as_list(combo.values["target"]):
            if isinstance(name, bool) or not isinstance(name, (str, int, float)) or name == "":
                self._fail(combo, "target", f"target {name!r} must be a name or a compute capability")
                return None
            name = _text(name)
            gpus += self.targets.get(name, [name])
        archs: set[str] = set()
        for gpu in gpus:
            cc = self.compat.capability_of(gpu)
            if cc is None:
                known = list(self.targets) + sorted(self.compat.gpus)
                self._fail(
                    combo,
                    "target",
                    f"unknown GPU or target {gpu!r}",
                    hint=f"{did_you_mean(gpu, known)}; or write its compute capability, e.g. sm_86",
                )
                return None
            arch = self.compat.arch_for_capability(cc)
            if arch is None or Version(cc) < Version("8.0"):
                self._fail(
                    combo,
                    "target",
                    f"{gpu} (compute capability {cc}) cannot run flash-attn 2",
                    hint="flash-attn 2 needs Ampere (8.0) or newer",
                )
                return None
            archs.add(arch)
        return tuple(sorted(archs, key=int)), tuple(gpus)

    def entry(self, combo: _Combo) -> Entry | None:
        """Validates one combination; every problem is recorded, None if there were any."""
        before = len(self.problems)
        for key in combo.values:
            if key not in AXES:
                self._fail(combo, key, f"unknown key {key!r}", hint=did_you_mean(key, AXES))
        python, torch_v, fa = (self._version(combo, k) for k in ("python", "torch", "flash_attn"))
        cuda = combo.values.get("cuda")
        if cuda is not None:
            cuda = self._version(combo, "cuda")
        archs, gpus = self.archs_for(combo) or ((), ())
        pythons = self.compat.pythons
        if python is not None and python not in pythons:
            self._fail(combo, "python", f"Python {python} is not supported", hint=f"use one of {', '.join(pythons)}")
        torch_ver = Version(torch_v) if torch_v else None
        release = self.compat.torch.get(torch_v) if torch_v else None
        if (
            torch_v
            and release is None
            and self._known(combo, "torch", torch_v, list(self.compat.torch), "torch")
            and cuda is None
        ):
            self._fail(combo, "cuda", f"torch {torch_v} is not in the compat table, so cuda must be given")
        if release is not None:
            if python and python not in release.pythons and not self.allow_unknown:
                self._fail(
                    combo,
                    "python",
                    f"torch {torch_v} has no wheels for Python {python}",
                    hint=f"torch {torch_v} supports {', '.join(release.pythons)}",
                )
            if "cuda" not in combo.values:
                cuda = release.default_cuda
            if cuda and release.variant(cuda) is None:
                self._fail(
                    combo,
                    "cuda",
                    f"torch {torch_v} has no CUDA {cuda} build",
                    hint=f"its variants: {', '.join(v.cuda for v in release.variants)}",
                )
        cuda_ver = Version(cuda) if cuda else None
        if cuda_ver and torch_ver and cuda_ver.major >= 13 and torch_ver < Version(self.compat.cuda13_min_torch):
            self._fail(combo, "cuda", f"CUDA {cuda} needs torch >= {self.compat.cuda13_min_torch}, not {torch_v}")
        cuda_rel = self.compat.cuda.get(cuda) if cuda else None
        if cuda and cuda_ver and cuda_rel is None:
            self._fail(
                combo,
                "cuda",
                f"CUDA {cuda} is not in the compat table",
                hint=f"known: {', '.join(self.compat.cuda)}; add it with --compat FILE",
            )
        fa_ver = Version(fa) if fa else None
        if fa_ver is not None and fa_ver not in self.compat.flash_attn_range:
            self._fail(
                combo,
                "flash_attn",
                f"flash-attn {fa} cannot be built by fa-images",
                hint=f"supported: {self.compat.flash_attn_range}",
            )
        elif fa is not None and fa_ver is not None:
            self._known(combo, "flash_attn", fa, list(self.compat.flash_attn), "flash-attn")
        arch_key = "archs" if "archs" in combo.values else "target"
        for arch in archs:
            if arch not in self.compat.archs:
                self._fail(
                    combo,
                    arch_key,
                    f"arch {arch} is not in the compat table",
                    hint=f"known: {', '.join(self.compat.archs)}",
                )
            elif cuda_ver and cuda_ver < Version(self.compat.archs[arch][0]):
                self._fail(
                    combo, arch_key, f"arch {arch} needs CUDA >= {self.compat.archs[arch][0]}, this entry uses {cuda}"
                )
        ptx = combo.values.get("ptx", self.build_opts.ptx)
        if not isinstance(ptx, bool):
            self._fail(combo, "ptx", f"ptx must be true or false, not {ptx!r}")
        if len(self.problems) > before or not (python and torch_v and fa and cuda and cuda_rel and archs):
            return None
        variant = release.variant(cuda) if release else None
        fa_rel = self.compat.flash_attn.get(fa)
        tag = f"fa{fa}-py{python}-torch{torch_v}-cu{cuda.replace('.', '')}"
        fill = {"cuda": cuda, "cuda_release": cuda_rel.release, "cuda_tag": "cu" + cuda.replace(".", "")}
        bad_tag = grammar.image_tag(tag)
        if bad_tag:  # Docker refuses it at tag time, after the compile: refuse it now
            self._fail(combo, None, f"the image tag {bad_tag}")
            return None
        return Entry(
            id=tag,
            python=python,
            torch=torch_v,
            cuda=cuda,
            cuda_release=cuda_rel.release,
            flash_attn=fa,
            archs=archs,
            ptx=bool(ptx),
            gpus=gpus,
            cxx11_abi=variant.cxx11_abi if variant else None,
            sdist_sha256=fa_rel.sha256 if fa_rel else None,
            image=f"{self.image}:{tag}",
            devel_image=fill_placeholders(self.bases.devel, fill),
            runtime_image=fill_placeholders(self.bases.runtime, fill),
            torch_index=fill_placeholders(self.packages.torch_index, fill) if self.packages.torch_index else None,
        )


PLACEHOLDERS = {"cuda": "12.8", "cuda_release": "12.8.1", "cuda_tag": "cu128"}  # name -> a sample value
# The grammar each setting must follow before it may reach a Dockerfile or the engine.
SETTING_GRAMMAR: dict[tuple[str, str], Callable[[str], str | None]] = {
    ("bases", "devel"): grammar.image_reference,
    ("bases", "runtime"): grammar.image_reference,
    ("bases", "uv_version"): grammar.version,
    ("bases", "python_mirror"): grammar.index_url,
    ("packages", "index"): grammar.index_url,
    ("packages", "torch_index"): grammar.index_url,
    ("packages", "find_links"): grammar.find_links,
    ("packages", "flash_attn_index"): grammar.index_url,
    ("build", "network"): grammar.network,
    ("build", "memory"): grammar.memory,
}
TEMPLATED = {("bases", "devel"), ("bases", "runtime"), ("packages", "torch_index")}
VERSION_GRAMMAR: dict[str, Callable[[str], str | None]] = {
    "python": grammar.matches(grammar.PYTHON, "3.12"),
    "cuda": grammar.matches(grammar.CUDA, "12.8"),
    "torch": grammar.version,
    "flash_attn": grammar.version,
}


def fill_placeholders(template: str, values: dict[str, str]) -> str:
    """``template`` with ``{cuda_release}`` etc. filled; raises ValueError naming a bad placeholder."""
    known = ", ".join("{" + name + "}" for name in values)
    try:
        fields = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"{exc} (write a literal brace as {{{{ or }}}}; placeholders: {known})") from None
    out = []
    for literal, name, spec, conversion in fields:
        out.append(literal)
        if name is None:
            continue
        if name not in values or spec or conversion:
            text = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            raise ValueError(f"{text} is not one of {known}")
        out.append(values[name])
    return "".join(out)


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
        problems.append(doc.problem((key,), f"{key} must be a mapping, not {_kind(raw)}"))
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
            value = tuple(_as_list(value))  # one string is a list of one, not of its characters
        if value is None and "None" not in str(cls.__dataclass_fields__[name].type):
            problems.append(doc.problem((key, name), f"{key}.{name} may not be null (default: {default!r})"))
            continue
        wanted = type(default) if default is not None else str
        items = value if isinstance(value, tuple) else (value,)
        typed = isinstance(value, wanted) and (wanted is not tuple or all(isinstance(v, str) for v in value))
        if value is not None and not typed:
            what = "list of strings" if wanted is tuple else {"str": "string", "bool": "true or false"}[wanted.__name__]
            problems.append(doc.problem((key, name), f"{key}.{name} must be a {what}, not {_kind(value)}"))
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


def _kind(value: Any) -> str:
    """How a YAML value reads in an error line: 'a list ([])', 'the string \'false\''."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"the string {value!r}"
    kind = {bool: "a boolean", int: "a number", float: "a number", list: "a list", dict: "a mapping"}
    return f"{kind.get(type(value), type(value).__name__)} ({getattr(value, 'text', value)!r})"


def load(path: Path, *, compat_override: Path | None = None) -> Matrix:
    """Parses and validates ``path``; ``compat_override`` is merged after the matrix's own ``compat:``."""
    doc = yamlfile.load(path, what="matrix file")
    problems: list[Problem] = []
    for key in doc.data:
        if key not in TOP_KEYS:
            problems.append(doc.problem((key,), f"unknown key {key!r}", hint=did_you_mean(key, TOP_KEYS)))
    compat_file = doc.data.get("compat")
    if compat_file is not None and not (isinstance(compat_file, str) and compat_file):
        problems.append(doc.problem(("compat",), f"compat must be a file path, not {_kind(compat_file)}"))
        compat_file = None
    overrides = [(path.parent / compat_file).resolve()] if compat_file else []
    compat = compat_mod.load(*overrides, *([compat_override] if compat_override else []))
    image = doc.data.get("image", DEFAULT_IMAGE)
    bad_image = grammar.repository(image) if isinstance(image, str) else f"must be a string, not {_kind(image)}"
    if bad_image:
        problems.append(
            doc.problem(
                ("image",),
                f"image {image!r} {bad_image}",
                hint="e.g. ghcr.io/acme/flash-attn (lower case, no tag: tags come from the entries)",
            )
        )
        image = DEFAULT_IMAGE
    targets = doc.data.get("targets")
    if targets is None:
        targets = {}
    elif not isinstance(targets, dict):
        problems.append(
            doc.problem(
                ("targets",), f"targets must map names to lists of GPUs, not {_kind(targets)}", hint=TARGETS_EXAMPLE
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
    allow_unknown = doc.data.get("allow_unknown", False)
    if not isinstance(allow_unknown, bool):
        problems.append(
            doc.problem(("allow_unknown",), f"allow_unknown must be true or false, not {_kind(allow_unknown)}")
        )
        allow_unknown = False
    builder = _EntryBuilder(
        doc,
        compat,
        problems,
        targets={str(k): list(v) for k, v in targets.items()},
        image=image,
        bases=_section(doc, "bases", Bases, problems),
        packages=_section(doc, "packages", Packages, problems),
        build=_section(doc, "build", BuildOptions, problems),
        allow_unknown=allow_unknown,
    )
    combos = expand(doc, problems)
    if not combos and not problems:
        problems.append(doc.problem(("matrix",), "the matrix expands to no entries"))
    entries: list[Entry] = []
    seen: dict[str, str] = {}
    for combo in combos:
        entry = builder.entry(combo)
        if entry is None:
            continue
        if entry.id in seen:
            builder._fail(
                combo,
                None,
                f"expands to {entry.id}, which {seen[entry.id]} already builds",
                hint="remove one, or change an exclude/include rule",
            )
            continue
        seen[entry.id] = combo.label
        entries.append(entry)
    if problems:
        raise ConfigError(dedupe(problems))
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
    )

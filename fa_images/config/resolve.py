"""One combination of matrix values -> one checked ``Entry``, or problems with file and line.

Versions are checked against their grammar and the compatibility table, the CUDA variant and
archs are resolved, and placeholders in the base images and indexes are filled per entry.
A combination a rule made (``torch: ">=2.9"``) that the table has no build for is left out,
with the reason ``plan`` shows; the same combination written out by hand is refused.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from packaging.version import Version

from ..builder import contract
from ..builder import generations as builder_generations
from ..builder.errors import UsageError
from ..builder.settings import gpu_class, parse_archs
from ..errors import Problem
from . import generations, grammar, yamlfile
from .compat import Compat, CudaRelease, TorchRelease, arch_runs_on, did_you_mean, gpu_key
from .expand import AXES, RULE_EXAMPLES, Combo, as_list, as_written, kind
from .model import Bases, BuildOptions, Entry, LeftOut, Packages

PLACEHOLDERS = {"cuda": "12.8", "cuda_release": "12.8.1", "cuda_tag": "cu128"}  # name -> a sample value
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


class EntryResolver:
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
        settings: dict[str, Any] | None = None,
    ) -> None:
        self.doc, self.compat, self.problems = doc, compat, problems
        self.targets, self.image, self.bases, self.packages = targets, image, bases, packages
        self.build_opts, self.allow_unknown = build, allow_unknown
        self.settings = settings or {}  # each generation's own section, as its settings
        self.left_out: list[LeftOut] = []

    def settings_of(self, section: generations.Section) -> Any:
        """A generation's settings from its section of the matrix, or its defaults."""
        return self.settings.get(section.key) or section.settings()

    def fail(self, combo: Combo, key: str | None, message: str, hint: str | None = None) -> None:
        path = combo.key_origin.get(key or "", combo.origin + ((key,) if key else ()))
        self.problems.append(self.doc.problem(path, message, entry=combo.label, hint=hint))

    def _version(self, combo: Combo, key: str) -> str | None:
        value = combo.values.get(key)
        if value is None:
            self.fail(combo, key, f"{key} is missing")
            return None
        if isinstance(value, dict) and key in RULE_EXAMPLES:
            self.fail(
                combo,
                key,
                f"{key} must be one quoted version here, not {kind(value)}",
                hint="a rule ({newest: N}, a specifier) names the versions of a matrix axis, not of one entry",
            )
            return None
        if not isinstance(value, str):
            written = as_written(value)
            hint = f'write {key}: "{written}"'
            if isinstance(value, float) and written != str(value):
                hint += f"; YAML reads an unquoted {written} as the number {value}"
            self.fail(combo, key, f"{key} {written} must be a quoted string", hint=hint)
            return None
        problem = VERSION_GRAMMAR[key](value)
        if problem:
            self.fail(combo, key, f"{key} {problem}")
            return None
        return value

    def _known(self, combo: Combo, key: str, value: str, known: list[str], what: str) -> bool:
        if value in known:
            return True
        if self.allow_unknown:
            return True
        self.fail(
            combo,
            key,
            f"{what} {value} is not in the compat table",
            hint=f"{did_you_mean(value, known) if value[:1].isalpha() else 'known: ' + ', '.join(known)}; "
            "add it with --compat FILE, or set allow_unknown: true",
        )
        return False

    def archs_for(self, combo: Combo, ptx: bool = False) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
        """(archs, GPU names) from `archs`, from `target` names, or both when they agree."""
        if "archs" not in combo.values and "target" not in combo.values:
            self.fail(
                combo,
                None,
                "no target and no archs: name the GPUs it is for",
                hint="e.g. target: aws (a name under targets:) or archs: [80]",
            )
            return None
        gpus = self.target_gpus(combo) if "target" in combo.values else []
        if gpus is None:
            return None
        names = tuple(gpu for gpu, _, _ in gpus)
        if "archs" not in combo.values:
            return tuple(sorted({arch for _, _, arch in gpus}, key=int)), names
        try:
            text = ",".join(map(str, as_list(combo.values["archs"])))
            archs = parse_archs(text, known=self.compat.arch_codes)
        except ValueError as exc:
            self.fail(combo, "archs", str(exc))
            return None
        missed = [(gpu, cc, arch) for gpu, cc, arch in gpus if not arch_runs_on(archs, cc, ptx=ptx)]
        if missed:  # both given and they disagree: refuse, never drop the target
            shown = ", ".join(f"{gpu} (sm_{cc.replace('.', '')})" for gpu, cc, _ in missed)
            wanted = sorted({arch for _, _, arch in missed}, key=int)
            self.fail(
                combo,
                "archs",
                f"archs [{', '.join(archs)}] do not cover target {shown}",
                hint=f"add {', '.join(wanted)} to archs, or drop archs to take the target's",
            )
            return None
        return archs, names

    def target_gpus(self, combo: Combo, runs: str = "flash-attn 2") -> list[tuple[str, str, str]] | None:
        """(GPU name, compute capability, the arch it needs) of each GPU the `target` names; ``runs``:
        what the entry builds, which no GPU older than Ampere runs."""
        gpus: list[tuple[str, str]] = []  # (the name written, a GPU it stands for)
        for name in as_list(combo.values["target"]):
            if isinstance(name, bool) or not isinstance(name, (str, int, float)) or name == "":
                self.fail(combo, "target", f"target {name!r} must be a name or a compute capability")
                return None
            name = as_written(name)
            if name not in self.targets and (why := self.compat.unbuilt_family(name)):
                self.fail(combo, "target", why)
                return None
            gpus += [(name, g) for g in self.targets.get(name) or self.compat.target_gpus(name)]
        found: list[tuple[str, str, str]] = []
        once: dict[str, tuple[str, str]] = {}  # a GPU named twice is one GPU, where it was first named
        for name, gpu in gpus:
            once.setdefault(gpu_key(gpu), (name, gpu))
        for name, gpu in once.values():
            cc = self.compat.capability_of(gpu)
            if cc is None:
                known = list(self.targets) + self.compat.target_names()
                self.fail(
                    combo,
                    "target",
                    f"unknown GPU or target {gpu!r}",
                    hint=f"{did_you_mean(gpu, known)}; or write its compute capability, e.g. sm_86",
                )
                return None
            arch = self.compat.fa2_arch(cc)
            if arch is None:
                whose = f"{name}'s {gpu}" if gpu_key(name) != gpu_key(gpu) else gpu
                self.fail(
                    combo,
                    "target",
                    f"{whose} (compute capability {cc}) cannot run {runs}",
                    hint=f"{runs} needs Ampere (8.0) or newer",
                )
                return None
            found.append((gpu, cc, arch))
        return found

    def entry(self, combo: Combo) -> Entry | None:
        """Validates one combination; every problem is recorded, None if there were any. The generation
        its flash-attn version names is decided here, once, and its module resolves the rest."""
        before = len(self.problems)
        for key in combo.values:
            if key not in AXES:
                self.fail(combo, key, f"unknown key {key!r}", hint=did_you_mean(key, AXES))
        python, torch_v, fa = (self._version(combo, k) for k in ("python", "torch", "flash_attn"))
        cuda = self._version(combo, "cuda") if combo.values.get("cuda") is not None else None
        gen = self._generation(combo, fa)
        module = generations.module_of(gen or builder_generations.FA2)  # a generation refused is said once
        versions = generations.Versions(python, torch_v, fa if gen is not None else None, cuda)
        return module.resolve(self, combo, versions, before)

    def check_python(self, combo: Combo, python: str | None) -> None:
        if python is not None and python not in self.compat.pythons:
            self.fail(
                combo,
                "python",
                f"Python {python} is not supported",
                hint=f"use one of {', '.join(self.compat.pythons)}",
            )

    def left_out_because(self, combo: Combo, reason: str | None) -> bool:
        """Records a combination a rule made that the table has no build for: True where there is a reason."""
        if reason:
            self.left_out.append(LeftOut(combination=combo.label, reason=reason))
        return reason is not None

    def made(
        self,
        combo: Combo,
        versions: generations.Versions,
        *,
        cuda: str,
        cuda_rel: CudaRelease,
        archs: tuple[str, ...],
        ptx: bool,
        gpus: tuple[str, ...],
        release: TorchRelease | None,
        sha256: str | None,
        recipe: generations.Recipe,
        cuda_note: str | None = None,
    ) -> Entry | None:
        """The entry, its image tag checked against Docker's grammar before anything is built; its
        C++ ABI that of its torch's variant (None for a torch the table does not know)."""
        python, torch_v, fa = versions.python, versions.torch, versions.flash_attn
        assert python and torch_v and fa  # its generation's resolve() made sure
        variant = release.variant(cuda) if release else None
        tag = f"fa{fa}-py{python}-torch{torch_v}-{contract.cuda_tag(cuda)}"
        fill = {"cuda": cuda, "cuda_release": cuda_rel.release, "cuda_tag": contract.cuda_tag(cuda)}
        bad_tag = grammar.image_tag(tag)
        if bad_tag:  # Docker refuses it at tag time, after the compile: refuse it now
            self.fail(combo, None, f"the image tag {bad_tag}")
            return None
        # The bases as this entry fills them: the settings were checked with sample values, and a
        # table's value (a long CUDA release) can still make a reference Docker refuses.
        bases = {
            "devel": fill_placeholders(self.bases.devel, fill),
            "runtime": fill_placeholders(self.bases.runtime, fill),
        }
        for key, ref in bases.items():
            if bad := grammar.image_reference(ref):
                self.fail(combo, None, f"bases.{key} becomes {ref!r} for this entry, which {bad}")
                return None
        return Entry(
            id=tag,
            python=python,
            torch=torch_v,
            cuda=cuda,
            cuda_release=cuda_rel.release,
            flash_attn=fa,
            archs=archs,
            ptx=ptx,
            gpus=gpus,
            cxx11_abi=variant.cxx11_abi if variant else None,
            sdist_sha256=sha256,
            image=f"{self.image}:{tag}",
            devel_image=bases["devel"],
            runtime_image=bases["runtime"],
            torch_index=fill_placeholders(self.packages.torch_index, fill) if self.packages.torch_index else None,
            recipe=recipe,
            cuda_note=cuda_note,
            torch_libraries=variant.libraries if variant else (),
        )

    def by_gpu_class(self, entry: Entry, combo: Combo) -> Entry | None:
        """The entry named by its GPU class (its id and image tag end in '-sm120', its wheel's
        +label in '.sm120'), the tag checked against Docker's grammar again."""
        named = gpu_class(entry.archs)
        tag = f"{entry.id}-{named}"
        if bad_tag := grammar.image_tag(tag):
            self.fail(combo, None, f"the image tag {bad_tag}")
            return None
        return replace(entry, id=tag, image=f"{self.image}:{tag}", gpu_class=named)

    def _generation(self, combo: Combo, fa: str | None) -> builder_generations.Generation | None:
        if fa is None:
            return None
        try:
            gen = builder_generations.of_version(fa)
        except UsageError as exc:
            self.fail(combo, "flash_attn", exc.message, hint=exc.hint)
            return None
        return gen

    def left_out_reason(
        self, combo: Combo, python: str, torch_v: str, cuda: str | None, archs: tuple[str, ...]
    ) -> str | None:
        """Why the table has no build of this combination, where a rule chose a value the reason
        is about; None where it has one, or where only values written by hand are at fault (those
        are refused, by entry())."""
        release = self.compat.torch.get(torch_v)
        if release is None:
            return None
        ruled = combo.ruled
        # Without a cuda key, the CUDA is the torch's default: chosen by the torch's rule, if any.
        given = combo.values.get("cuda") is not None
        if given and cuda not in self.compat.cuda:
            return None  # a CUDA the table does not know is a mistake, not a missing build
        cuda_ruled = "cuda" in ruled if given else "torch" in ruled
        cuda = cuda if given else self.compat.cuda_for(release, archs)[0]
        if ruled & {"python", "torch"} and python not in release.pythons:
            return f"torch {torch_v} has no wheels for Python {python}"
        if not cuda:
            return None
        if ruled & {"torch", "cuda"} and release.variant(cuda) is None:
            return f"torch {torch_v} has no CUDA {cuda} build"
        needs = [(a, self.compat.archs[a][0]) for a in archs if a in self.compat.archs]
        too_old = next(((a, need) for a, need in needs if Version(cuda) < Version(need)), None)
        if cuda_ruled and too_old:
            return f"arch {too_old[0]} needs CUDA >= {too_old[1]}, not {cuda}"
        return None

    def torch_release(
        self, combo: Combo, python: str | None, torch_v: str | None, cuda: str | None, archs: tuple[str, ...] = ()
    ) -> tuple[TorchRelease | None, str | None, str | None]:
        """The torch release (None if unknown), the CUDA variant (as given, else the one its archs
        need: Compat.cuda_for) and why that CUDA where it is not the torch's default."""
        release = self.compat.torch.get(torch_v) if torch_v else None
        note = None
        if torch_v and release is None:
            if self._known(combo, "torch", torch_v, list(self.compat.torch), "torch") and cuda is None:
                self.fail(combo, "cuda", f"torch {torch_v} is not in the compat table, so cuda must be given")
            return None, cuda, note
        if release is None:
            return None, cuda, note
        if python and python not in release.pythons and not self.allow_unknown:
            self.fail(
                combo,
                "python",
                f"torch {torch_v} has no wheels for Python {python}",
                hint=f"torch {torch_v} supports {', '.join(release.pythons)}",
            )
        if "cuda" not in combo.values:
            cuda, note = self.compat.cuda_for(release, archs)
        if cuda and release.variant(cuda) is None:
            self.fail(
                combo,
                "cuda",
                f"torch {torch_v} has no CUDA {cuda} build",
                hint=f"its variants: {', '.join(v.cuda for v in release.variants)}",
            )
        return release, cuda, note

    def cuda_release(self, combo: Combo, cuda: str | None, torch_v: str | None) -> CudaRelease | None:
        """The CUDA release of the table, checked against the torch it goes with."""
        if not cuda:
            return None
        cuda_ver = Version(cuda)
        if torch_v and cuda_ver.major >= 13 and Version(torch_v) < Version(self.compat.cuda13_min_torch):
            self.fail(combo, "cuda", f"CUDA {cuda} needs torch >= {self.compat.cuda13_min_torch}, not {torch_v}")
        cuda_rel = self.compat.cuda.get(cuda)
        if cuda_rel is None:
            self.fail(
                combo,
                "cuda",
                f"CUDA {cuda} is not in the compat table",
                hint=f"known: {', '.join(self.compat.cuda)}; add it with --compat FILE",
            )
        return cuda_rel

    def check_flash_attn(self, combo: Combo, fa: str | None) -> None:
        if fa is None:
            return
        if Version(fa) not in self.compat.flash_attn_range:
            self.fail(
                combo,
                "flash_attn",
                f"flash-attn {fa} cannot be built by fa-images",
                hint=f"supported: {self.compat.flash_attn_range}",
            )
        else:
            self._known(combo, "flash_attn", fa, list(self.compat.flash_attn), "flash-attn")

    def check_archs(self, combo: Combo, archs: tuple[str, ...], cuda: str | None) -> None:
        """Each arch is in the table, and the entry's CUDA compiles for it."""
        key = "archs" if "archs" in combo.values else "target"
        for arch in archs:
            if arch not in self.compat.archs:
                self.fail(
                    combo, key, f"arch {arch} is not in the compat table", hint=f"known: {', '.join(self.compat.archs)}"
                )
            elif cuda and Version(cuda) < Version(self.compat.archs[arch][0]):
                self.fail(combo, key, f"arch {arch} needs CUDA >= {self.compat.archs[arch][0]}, this entry uses {cuda}")

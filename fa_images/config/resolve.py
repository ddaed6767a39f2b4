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

from packaging.version import Version

from ..builder import contract, generations, gpuarch
from ..builder.errors import UsageError
from ..builder.generations import fa3, fa4
from ..builder.settings import gpu_class, parse_archs
from ..errors import Problem
from . import grammar, yamlfile
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
        fa3_build: fa3.Fa3Build | None = None,
        fa4_grid: fa4.Fa4Grid | None = None,
    ) -> None:
        self.doc, self.compat, self.problems = doc, compat, problems
        self.targets, self.image, self.bases, self.packages = targets, image, bases, packages
        self.build_opts, self.allow_unknown = build, allow_unknown
        self.fa3_build = fa3_build or fa3.Fa3Build()
        self.fa4_grid = fa4_grid or fa4.Fa4Grid()
        self.left_out: list[LeftOut] = []

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
        gpus = self._target_gpus(combo) if "target" in combo.values else []
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

    def _target_gpus(self, combo: Combo, runs: str = "flash-attn 2") -> list[tuple[str, str, str]] | None:
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
        """Validates one combination; every problem is recorded, None if there were any."""
        before = len(self.problems)
        for key in combo.values:
            if key not in AXES:
                self.fail(combo, key, f"unknown key {key!r}", hint=did_you_mean(key, AXES))
        python, torch_v, fa = (self._version(combo, k) for k in ("python", "torch", "flash_attn"))
        cuda = self._version(combo, "cuda") if combo.values.get("cuda") is not None else None
        gen = self._generation(combo, fa)
        if gen is generations.FA3:
            return self._fa3_entry(combo, before, python, torch_v, fa, cuda)
        if gen is generations.FA4:
            return self._fa4_entry(combo, before, python, torch_v, fa, cuda)
        ptx = combo.values.get("ptx", self.build_opts.ptx)
        archs, gpus = self.archs_for(combo, ptx=ptx is True) or ((), ())
        if python is not None and python not in self.compat.pythons:
            self.fail(
                combo,
                "python",
                f"Python {python} is not supported",
                hint=f"use one of {', '.join(self.compat.pythons)}",
            )
        if len(self.problems) == before and python and torch_v and combo.ruled:
            reason = self._left_out_reason(combo, python, torch_v, cuda, archs)
            if reason:
                self.left_out.append(LeftOut(combination=combo.label, reason=reason))
                return None
        release, cuda, cuda_note = self._torch(combo, python, torch_v, cuda, archs)
        cuda_rel = self._cuda(combo, cuda, torch_v)
        self._flash_attn(combo, fa if gen is not None else None)  # a generation refused is said once
        self._archs(combo, archs, cuda)
        if not isinstance(ptx, bool):
            self.fail(combo, "ptx", f"ptx must be true or false, not {ptx!r}")
        if len(self.problems) > before or not (python and torch_v and fa and cuda and cuda_rel and archs):
            return None
        fa_rel = self.compat.flash_attn.get(fa)
        return self._made(
            combo,
            python=python,
            torch_v=torch_v,
            cuda=cuda,
            cuda_rel=cuda_rel,
            fa=fa,
            archs=archs,
            ptx=bool(ptx),
            gpus=gpus,
            release=release,
            sha256=fa_rel.sha256 if fa_rel else None,
            cuda_note=cuda_note,
        )

    def _made(
        self,
        combo: Combo,
        *,
        python: str,
        torch_v: str,
        cuda: str,
        cuda_rel: CudaRelease,
        fa: str,
        archs: tuple[str, ...],
        ptx: bool,
        gpus: tuple[str, ...],
        release: TorchRelease | None,
        sha256: str | None,
        fa3_build: fa3.Fa3Build | None = None,
        fa4_grid: fa4.Fa4Grid | None = None,
        cuda_note: str | None = None,
    ) -> Entry | None:
        """The entry, its image tag checked against Docker's grammar before anything is built; its
        C++ ABI that of its torch's variant (None for a torch the table does not know)."""
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
            fa3=fa3_build,
            fa4=fa4_grid,
            cuda_note=cuda_note,
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

    def _generation(self, combo: Combo, fa: str | None) -> generations.Generation | None:
        if fa is None:
            return None
        try:
            gen = generations.of_version(fa)
        except UsageError as exc:
            self.fail(combo, "flash_attn", exc.message, hint=exc.hint)
            return None
        return gen

    def _fa3_entry(
        self, combo: Combo, before: int, python: str | None, torch_v: str | None, fa: str | None, cuda: str | None
    ) -> Entry | None:
        """A FlashAttention-3 entry: torch's stable ABI (torch >= 2.9), a CUDA its setup.py builds with
        and nothing downloaded, and the GPUs its kernels run on (sm_90a: 9.0; sm_80: 8.x)."""
        build = self.fa3_build
        for key in ("archs", "ptx"):
            if key in combo.values:
                self.fail(
                    combo, key, f"{key} is not for FlashAttention-3: its kernels are sm_90a and sm_80, as fa3: says"
                )
        gpus = self._fa3_gpus(combo, build)
        if python is not None and python not in self.compat.pythons:
            self.fail(
                combo,
                "python",
                f"Python {python} is not supported",
                hint=f"use one of {', '.join(self.compat.pythons)}",
            )
        if len(self.problems) == before and python and torch_v and combo.ruled:
            reason = self._fa3_left_out_reason(combo, python, torch_v, cuda)
            if reason:
                self.left_out.append(LeftOut(combination=combo.label, reason=reason))
                return None
        release, cuda, _ = self._torch(combo, python, torch_v, cuda)
        cuda_rel = self._cuda(combo, cuda, torch_v)
        fa_rel = self.compat.flash_attn_3.get(fa) if fa else None
        if fa and fa_rel is None:
            known = list(self.compat.flash_attn_3)
            self.fail(
                combo,
                "flash_attn",
                f"FlashAttention-3 {fa} is not in the compat table (flash_attn_3:)",
                hint=f"known: {', '.join(known) or 'none'}; add it with --compat FILE",
            )
        if torch_v and Version(torch_v) < fa3.STABLE_ABI_TORCH:
            self.fail(
                combo,
                "torch",
                f"FlashAttention-3 is built on torch's stable ABI, from torch {fa3.STABLE_ABI_TORCH}; not {torch_v}",
            )
        if cuda and (why := fa3.refuse_cuda(cuda)):
            self.fail(combo, "cuda" if "cuda" in combo.values else "torch", why)
        if len(self.problems) > before or not (
            python and torch_v and fa and fa_rel and cuda and cuda_rel and gpus is not None
        ):
            return None
        return self._made(
            combo,
            python=python,
            torch_v=torch_v,
            cuda=cuda,
            cuda_rel=cuda_rel,
            fa=fa,
            archs=build.archs,
            ptx=False,
            gpus=gpus,
            release=release,
            sha256=fa_rel.sha256,
            fa3_build=build,
        )

    def _fa4_entry(
        self, combo: Combo, before: int, python: str | None, torch_v: str | None, fa: str | None, cuda: str | None
    ) -> Entry | None:
        """A FlashAttention-4 entry: its pinned set for the torch's CUDA major, and its kernels compiled
        into the image for each GPU of the target (its capability and SM count: Compat.fa4_target)."""
        for key in ("archs", "ptx"):
            if key in combo.values:
                self.fail(combo, key, f"{key} is not for FlashAttention-4: its kernels are compiled for the target")
        targets = self._fa4_targets(combo)
        if python is not None and (python not in self.compat.pythons or Version(python) < Version("3.10")):
            self.fail(combo, "python", f"FlashAttention-4 needs Python >= 3.10 (its DSL's wheels), not {python}")
        release, cuda, _ = self._torch(combo, python, torch_v, cuda)
        cuda_rel = self._cuda(combo, cuda, torch_v)
        fa_rel = self.compat.flash_attn_4.get(fa) if fa else None
        if fa and fa_rel is None:
            known = ", ".join(self.compat.flash_attn_4) or "none"
            self.fail(
                combo,
                "flash_attn",
                f"FlashAttention-4 {fa} is not in the compat table (flash_attn_4:)",
                hint=f"known: {known}",
            )
        major = cuda.split(".")[0] if cuda else None
        if fa_rel is not None and major is not None and major not in fa_rel.pins:
            majors = ", ".join(f"CUDA {m}" for m in fa_rel.pins)
            self.fail(
                combo,
                "cuda" if "cuda" in combo.values else "torch",
                f"FlashAttention-4 {fa} has no pinned set for CUDA {major} (the table has {majors})",
                hint=self._fa4_cuda_hint(fa_rel.pins, torch_v),
            )
        if len(self.problems) > before or not (python and torch_v and fa and cuda and cuda_rel and targets):
            return None
        # Its kernels run where they were compiled for: each GPU's own arch ('90a': 9.0 only).
        archs = tuple(gpuarch.sorted_archs({t.compile_target.removeprefix("sm_") for t in targets}))
        return self._made(
            combo,
            python=python,
            torch_v=torch_v,
            cuda=cuda,
            cuda_rel=cuda_rel,
            fa=fa,
            archs=archs,
            ptx=False,
            gpus=tuple(t.name for t in targets),
            release=release,
            sha256=None,
            fa4_grid=self.fa4_grid,
        )

    def _fa4_cuda_hint(self, pinned: dict, torch_v: str | None) -> str:
        """Where FA4 works today: this torch's own build for a CUDA it has a pinned set for, else the
        torch releases that have one."""
        own = self.compat.torch.get(torch_v or "")
        same = [v.cuda for v in own.variants if v.cuda.split(".")[0] in pinned] if own else []
        if same:
            return f'torch {torch_v} has a CUDA {same[-1]} build: write cuda: "{same[-1]}"'
        works = [
            f"{t.version} (CUDA {v.cuda})"
            for t in self.compat.torch.values()
            for v in t.variants
            if v.cuda.split(".")[0] in pinned
        ]
        if not works:
            return "add a pinned set with --compat FILE"
        return f"use a torch built for CUDA {', '.join(pinned)}, such as torch " + ", ".join(works[-3:])

    def _fa4_targets(self, combo: Combo) -> tuple[fa4.Fa4Target, ...] | None:
        """The target's GPUs as FA4's kernels are compiled for them: each one's capability and SM
        count from the compat table (``Compat.fa4_target``)."""
        if "target" not in combo.values:
            self.fail(combo, None, "no target: name the GPUs its kernels are compiled for", hint="e.g. target: [H100]")
            return None
        found = self._target_gpus(combo, "FlashAttention-4")
        if found is None:
            return None
        targets = [self.compat.fa4_target(gpu) for gpu, _cc, _arch in found]
        refused = [why for why in targets if isinstance(why, str)]
        refused += [
            f"{t.name} runs none of the grid's calls ({fa4.refused('train', t.major)})"
            for t in targets
            if not isinstance(t, str) and not self.fa4_grid.points(t.major)
        ]
        if refused:
            self.fail(combo, "target", f"FlashAttention-4's kernels cannot be compiled ahead: {'; '.join(refused)}")
            return None
        return tuple({t.name: t for t in targets if not isinstance(t, str)}.values())

    def _fa3_gpus(self, combo: Combo, build: fa3.Fa3Build) -> tuple[str, ...] | None:
        """The target's GPUs, each one FA3's kernels run on: 9.0 (sm_90a), 8.x (sm_80, unless left out)."""
        if "target" not in combo.values:
            self.fail(combo, None, "no target: name the GPUs it is for", hint="e.g. target: [H100]")
            return None
        found = self._target_gpus(combo)
        if found is None:
            return None
        for gpu, cc, _arch in found:
            runs = cc == "9.0" or (cc.startswith("8.") and "80" in build.archs)
            if not runs:
                why = (
                    "its sm_80 kernels are left out (fa3.without: sm80)"
                    if cc.startswith("8.")
                    else "FA3's kernels are sm_90a (9.0 only) and sm_80 (8.x)"
                )
                self.fail(combo, "target", f"FlashAttention-3 cannot run on {gpu} (compute capability {cc}): {why}")
                return None
        return tuple(gpu for gpu, _, _ in found)

    def _fa3_left_out_reason(self, combo: Combo, python: str, torch_v: str, cuda: str | None) -> str | None:
        release = self.compat.torch.get(torch_v)
        if release is None:
            return None
        if "torch" in combo.ruled and Version(torch_v) < fa3.STABLE_ABI_TORCH:
            return f"FlashAttention-3 is built on torch's stable ABI, from torch {fa3.STABLE_ABI_TORCH}"
        if combo.ruled & {"python", "torch"} and python not in release.pythons:
            return f"torch {torch_v} has no wheels for Python {python}"
        given = combo.values.get("cuda") is not None
        cuda = cuda if given else release.default_cuda
        if ("cuda" in combo.ruled if given else "torch" in combo.ruled) and cuda and release.variant(cuda) is None:
            return f"torch {torch_v} has no CUDA {cuda} build"
        if ("cuda" in combo.ruled if given else "torch" in combo.ruled) and cuda and (why := fa3.refuse_cuda(cuda)):
            return why
        return None

    def _left_out_reason(
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

    def _torch(
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

    def _cuda(self, combo: Combo, cuda: str | None, torch_v: str | None) -> CudaRelease | None:
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

    def _flash_attn(self, combo: Combo, fa: str | None) -> None:
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

    def _archs(self, combo: Combo, archs: tuple[str, ...], cuda: str | None) -> None:
        """Each arch is in the table, and the entry's CUDA compiles for it."""
        key = "archs" if "archs" in combo.values else "target"
        for arch in archs:
            if arch not in self.compat.archs:
                self.fail(
                    combo, key, f"arch {arch} is not in the compat table", hint=f"known: {', '.join(self.compat.archs)}"
                )
            elif cuda and Version(cuda) < Version(self.compat.archs[arch][0]):
                self.fail(combo, key, f"arch {arch} needs CUDA >= {self.compat.archs[arch][0]}, this entry uses {cuda}")

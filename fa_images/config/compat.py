"""The compatibility knowledge (compat.yaml), loaded, merged with overrides, validated.

Every fact about which torch ships which CUDA variants and Pythons, which C++ ABI a
variant uses, which GPU needs which arch and which flash-attn sdist has which sha256
lives in the data file; the code here only checks its shape and answers questions.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from ..builder import contract, gpuarch
from ..builder.settings import ARCH_CODES
from ..builder.source import SUPPORTED_FLASH_ATTN
from ..errors import ConfigError
from . import generations, grammar, tablecheck, yamlfile

DEFAULT_FILE = Path(__file__).with_name("compat.yaml")
_DRIVER = re.compile(r"\d{3}(?:\.\d+)*", re.ASCII)


def sections() -> tuple[str, ...]:
    """The table's sections: its own, and each generation's releases (config/generations/)."""
    return (
        "pythons",
        "torch",
        "cuda",
        "rules",
        "archs",
        "gpus",
        "instances",
        "targets",
        "build_tools",
        "build_tools_python",
        "runtime_deps",
        "runtime_deps_python",
        "flash_attn_range",
        "flash_attn",
        *(m.TABLE for m in generations.MODULES if m.TABLE),
    )


# torch's CUDA libraries at its pins: a tuple of pins per layer of the torch stage, in install order.
Layers = tuple[tuple[str, ...], ...]


@dataclass(frozen=True, kw_only=True)
class CudaVariant:
    cuda: str
    cxx11_abi: bool
    # its library layers, as compatgen.library_layers reads them; empty where the table does not
    # know them: one layer, torch's.
    libraries: Layers = ()

    @property
    def tag(self) -> str:
        """'cu128': the suffix of torch's variant index and of image tags."""
        return contract.cuda_tag(self.cuda)


@dataclass(frozen=True, kw_only=True)
class TorchRelease:
    version: str
    pythons: tuple[str, ...]
    default_cuda: str
    variants: tuple[CudaVariant, ...]

    def variant(self, cuda: str) -> CudaVariant | None:
        return next((v for v in self.variants if v.cuda == cuda), None)


@dataclass(frozen=True, kw_only=True)
class CudaRelease:
    version: str
    release: str  # "12.8.1": the tag of its images
    min_driver: str


@dataclass(frozen=True, kw_only=True)
class FlashAttnRelease:
    version: str
    sha256: str
    cuda_archs_env: bool


@dataclass(frozen=True)
class Gpu:
    """A GPU of the table's gpus section: its name there ("RTXPRO6000"), compute capability, SM count."""

    name: str
    capability: str
    sms: int | None

    @property
    def major(self) -> int:
        return int(self.capability.split(".")[0])


@dataclass(frozen=True, kw_only=True)
class Instance:
    """An AWS instance family: its GPU, and its CPU (an aarch64 family is listed, never built)."""

    gpu: str
    cpu: str = "x86_64"


@dataclass(frozen=True, kw_only=True)
class Compat:
    torch: dict[str, TorchRelease]
    cuda: dict[str, CudaRelease]
    archs: dict[str, tuple[str, str]]  # arch -> (min CUDA, compute capability major)
    gpus: dict[str, str]  # upper-case name -> compute capability
    flash_attn: dict[str, FlashAttnRelease]
    build_tools: tuple[str, ...]  # the default pins; tools_for() applies the per-Python ones
    cuda13_min_torch: str
    # torch's CUDA libraries that NVIDIA releases apart from the toolkit: a layer each, after the
    # toolkit's own, in this order (compatgen.library_layers)
    libraries_apart: tuple[str, ...] = ()
    pythons: tuple[str, ...] = ()
    build_tools_python: dict[str, tuple[str, ...]] = field(default_factory=dict)
    runtime_deps: tuple[str, ...] = ()
    runtime_deps_python: dict[str, tuple[str, ...]] = field(default_factory=dict)
    flash_attn_range: SpecifierSet = field(default_factory=SpecifierSet)
    targets: dict[str, tuple[str, ...]] = field(default_factory=dict)  # name -> GPU names
    instances: dict[str, Instance] = field(default_factory=dict)  # lower-case family -> its GPU
    sms: dict[str, int] = field(default_factory=dict)  # upper-case name -> its SM count, where the table has it
    # Each later generation's releases, under its own key of the table (config/generations/).
    releases: dict[str, dict[str, Any]] = field(default_factory=dict)

    def tools_for(self, python: str) -> tuple[str, ...]:
        """The build-tool pins for one Python: its own pins replace the defaults of the same name."""
        return merged_pins(self.build_tools, self.build_tools_python.get(python, ()))

    def runtime_deps_for(self, python: str) -> tuple[str, ...]:
        """The runtime pins for one Python: its own pins replace the defaults of the same name."""
        return merged_pins(self.runtime_deps, self.runtime_deps_python.get(python, ()))

    @property
    def arch_codes(self) -> tuple[str, ...]:
        return tuple(sorted(self.archs, key=int))

    def arch_for_capability(self, capability: str) -> str | None:
        major = capability.split(".")[0]
        return next((a for a, (_, cc) in self.archs.items() if cc == major), None)

    @property
    def fa2_min_capability(self) -> str:
        """The oldest GPU flash-attn 2 runs on: the capability of the oldest arch in the archs table."""
        return f"{min(int(cc) for _min_cuda, cc in self.archs.values())}.0"

    def fa2_arch(self, capability: str) -> str | None:
        """The flash-attn 2 arch a GPU of ``capability`` runs; None for one older than every arch of the table."""
        return self.arch_for_capability(capability) if Version(capability) >= Version(self.fa2_min_capability) else None

    def unbuilt_family(self, name: str) -> str | None:
        """Why an instance family cannot be a target (an aarch64 one), or None. A name under
        targets: is the targets' and never a family."""
        family = self.instances.get(name.lower()) if name not in self.targets else None
        if family is None or family.cpu == "x86_64":
            return None
        return f"{name} is an {family.cpu} instance family ({family.gpu}): fa-images builds x86_64 images"

    def cuda_for(self, release: TorchRelease, archs: tuple[str, ...]) -> tuple[str, str | None]:
        """The CUDA of an entry that names none: its torch's default, or where an arch needs a newer
        CUDA, the oldest CUDA build of that torch that compiles every arch (with why); the default
        where none does, which is then refused or left out with the arch's reason."""
        need = max((Version(self.archs[a][0]) for a in archs if a in self.archs), default=None)
        if need is None or Version(release.default_cuda) >= need:
            return release.default_cuda, None
        covering = sorted((v.cuda for v in release.variants if Version(v.cuda) >= need), key=Version)
        if not covering:
            return release.default_cuda, None
        arch = next(a for a in archs if a in self.archs and Version(self.archs[a][0]) == need)
        return covering[0], (
            f"CUDA {covering[0]}, not torch {release.version}'s default {release.default_cuda}: "
            f"arch {arch} needs CUDA >= {need}"
        )

    def gpu(self, name: str) -> Gpu | None:
        """A GPU's facts as the table has them: its name there, compute capability and SM count
        (None where the table has none); None for a name that is not a GPU of its gpus section."""
        key = gpu_key(name)
        capability = self.capability_of(name)
        if capability is None or key not in self.gpus:
            return None
        return Gpu(key, capability, self.sms.get(key))

    def target_gpus(self, name: str) -> tuple[str, ...]:
        """The GPUs a target name stands for: a name under targets:, an instance family, else the
        name itself (a GPU, sm_XY or X.Y, which capability_of reads)."""
        if name in self.targets:
            return self.targets[name]
        family = self.instances.get(name.lower())
        return (family.gpu,) if family else (name,)

    def families_of(self, gpu: str) -> tuple[str, ...]:
        """The instance families whose GPU this is."""
        return tuple(f for f, i in self.instances.items() if gpu_key(i.gpu) == gpu_key(gpu))

    def gpus_that_run(self, archs, ptx=()) -> list[str]:
        """The table's GPUs that run this code, each with the instance families that have it:
        'RTXPRO6000 (AWS g7e)'. Where to check an image that this GPU cannot run."""
        return [
            gpu + (f" (AWS {', '.join(families)})" if (families := self.families_of(gpu)) else "")
            for gpu in gpuarch.gpus_that_run(archs, ptx, self.gpus)
        ]

    def target_names(self) -> list[str]:
        """Every name a `target` may take besides a compute capability, for hints."""
        return sorted(self.targets) + sorted(self.instances) + sorted(self.gpus)

    def capability_of(self, gpu: str) -> str | None:
        """'L4', 'sm_89' or '8.9' -> '8.9'."""
        name = gpu_key(gpu)
        if name in self.gpus:
            return self.gpus[name]
        digits = name.removeprefix("SM_").removeprefix("SM")
        if grammar.CAPABILITY.fullmatch(digits):
            return digits
        if re.fullmatch(r"\d{2,3}", digits, re.ASCII):
            return f"{digits[:-1]}.{digits[-1]}"
        return None


def arch_runs_on(archs: tuple[str, ...], capability: str, *, ptx: bool) -> bool:
    """Whether a wheel of ``archs`` runs on a GPU of ``capability`` ('8.9'): CUDA's rule, as the
    GPU check applies it to the built extension (``builder/gpuarch.py``); with ``ptx: true`` the
    wheel also carries the PTX of its newest arch."""
    major, _, minor = capability.partition(".")
    cap = (int(major), int(minor or 0))
    if any(gpuarch.cubin_runs(a, cap) for a in archs):
        return True
    return any(gpuarch.ptx_runs(a, cap) for a in gpuarch.built_ptx(archs, ptx))


def merged_pins(defaults: tuple[str, ...], own_pins: tuple[str, ...]) -> tuple[str, ...]:
    own = {_pin_name(p): p for p in own_pins}
    merged = [own.pop(_pin_name(p), p) for p in defaults]
    return tuple(merged + sorted(own.values()))


def _pin_name(pin: str) -> str:
    """The project a pin names, as pip compares them: ``nvidia_cudnn.cu12[x]==1`` is ``nvidia-cudnn-cu12``."""
    return canonicalize_name(pin.partition("==")[0].partition("[")[0])


def gpu_key(name: str) -> str:
    """'RTX PRO 6000' and 'rtx-pro-6000' are the same GPU."""
    return str(name).strip().upper().replace(" ", "").replace("-", "")


def did_you_mean(value: str, known: list[str] | tuple[str, ...]) -> str:
    """'did you mean 'torch'?' when ``value`` is close to a known name, else the known names."""
    close = difflib.get_close_matches(str(value), [str(k) for k in known], n=1)
    return f"did you mean {close[0]!r}?" if close else f"known: {', '.join(map(str, known))}"


def merge(base: dict, override: dict) -> dict:
    """Mappings merge key by key; anything else in ``override`` replaces."""
    out = dict(base)
    for key, value in override.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


_CUDA = grammar.matches(grammar.CUDA, "12.8")
_PYTHON = grammar.matches(grammar.PYTHON, "3.12")
_ARCH = grammar.matches(re.compile(r"\d{2,3}", re.ASCII), "90")
_MAJOR = grammar.matches(re.compile(r"\d{1,2}", re.ASCII), "9")


def _cuda(c: tablecheck.Checker, data: dict) -> dict[str, CudaRelease]:
    cuda = {}
    for ver, raw in c.mapping(("cuda",), data.get("cuda", {})).items():
        ver = c.key(("cuda", ver), ver, _CUDA)
        raw = c.mapping(("cuda", ver), raw)
        rel = c.version(("cuda", ver, "release"), raw.get("release"), grammar.matches(grammar.CUDA_RELEASE, "12.8.1"))
        driver = raw.get("min_driver")
        if driver is not None:
            driver = c.version(("cuda", ver, "min_driver"), driver, grammar.matches(_DRIVER, "525"))
        if ver and rel:
            cuda[ver] = CudaRelease(version=ver, release=rel, min_driver=driver or "")
    return cuda


def _torch(c: tablecheck.Checker, data: dict, cuda: dict[str, CudaRelease]) -> dict[str, TorchRelease]:
    torch = {}
    for ver, raw in c.mapping(("torch",), data.get("torch", {})).items():
        ver = c.key(("torch", ver), ver)
        raw = c.mapping(("torch", ver), raw)
        pythons = raw.get("python")
        if not isinstance(pythons, list) or not pythons:
            c.fail(("torch", ver, "python"), f'torch.{ver}.python must be a list of quoted versions like "3.12"')
            pythons = []
        pythons = [p for i, p in enumerate(pythons) if c.version(("torch", ver, "python", i), p, _PYTHON)]
        variants = []
        bad_variant = False
        for cu, v in c.mapping(("torch", ver, "cuda"), raw.get("cuda", {})).items():
            cu = c.key(("torch", ver, "cuda", cu), cu, _CUDA)
            v = c.mapping(("torch", ver, "cuda", cu), v)
            if cu is None or not isinstance(v.get("cxx11_abi"), bool):
                c.fail(("torch", ver, "cuda", cu), f"torch.{ver}.cuda.{cu}.cxx11_abi must be true or false")
                bad_variant = True
                continue
            if cu not in cuda:
                c.fail(("torch", ver, "cuda", cu), f"torch {ver} names CUDA {cu}, which the cuda section lacks")
            libraries = _library_layers(c, ("torch", ver, "cuda", cu, "libraries"), v.get("libraries", []))
            variants.append(CudaVariant(cuda=cu, cxx11_abi=v["cxx11_abi"], libraries=libraries))
        default = raw.get("default_cuda")
        if default not in [v.cuda for v in variants] and not bad_variant:  # a list: the value may be unhashable
            c.fail(
                ("torch", ver, "default_cuda"), f"torch.{ver}.default_cuda {default!r} is not one of its CUDA variants"
            )
        if ver:
            torch[ver] = TorchRelease(
                version=ver, pythons=tuple(pythons), default_cuda=str(default), variants=tuple(variants)
            )
    return torch


def _library_layers(c: tablecheck.Checker, path: tuple, value: Any) -> Layers:
    """A list of layers, each a list of pins; a library is pinned once, in one layer."""
    where = ".".join(map(str, path))
    if not isinstance(value, list) or not all(isinstance(layer, list) and layer for layer in value):
        c.fail(path, f'{where} must be a list of layers, each a list of pins like "nvidia-cudnn-cu12==9.10.2.21"')
        return ()
    layers = tuple(
        tuple(p for j, p in enumerate(layer) if c.version((*path, i, j), p, grammar.library_pin))
        for i, layer in enumerate(value)
    )
    names = [_pin_name(p) for layer in layers for p in layer]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        c.fail(path, f"{where} pins {', '.join(twice)} more than once")
    return layers


def _archs(c: tablecheck.Checker, data: dict) -> dict[str, tuple[str, str]]:
    archs = {}
    for arch, raw in c.mapping(("archs",), data.get("archs", {})).items():
        arch = c.key(("archs", arch), arch, _ARCH)
        raw = c.mapping(("archs", arch), raw)
        min_cuda = c.version(("archs", arch, "min_cuda"), raw.get("min_cuda"), _CUDA)
        cc = c.version(("archs", arch, "compute_capability"), raw.get("compute_capability"), _MAJOR)
        if arch and arch not in ARCH_CODES:
            # The builder inside the image checks --archs against its own copy: refuse it here, not there.
            c.fail(
                ("archs", arch),
                f"arch {arch} is not one the builder compiles ({', '.join(sorted(ARCH_CODES, key=int))})",
            )
        elif arch and min_cuda and cc:
            archs[arch] = (min_cuda, cc)
    return archs


def _gpus(c: tablecheck.Checker, data: dict) -> tuple[dict[str, str], dict[str, int]]:
    """Each GPU's compute capability, and its SM count where the table gives one: ``L4: "8.9"``
    or ``H100: {capability: "9.0", sms: 132}``."""
    gpus, sms = {}, {}
    for name, raw in c.mapping(("gpus",), data.get("gpus", {})).items():
        facts = raw if isinstance(raw, dict) else {"capability": raw}
        if set(facts) - {"capability", "sms"}:
            c.fail(
                ("gpus", name),
                f"GPU {name!r}: only capability and sms, not {sorted(map(str, set(facts) - {'capability', 'sms'}))}",
            )
            continue
        if facts.get("capability") is None:
            c.fail(("gpus", name), f'GPU {name!r}: its compute capability is missing (capability: "8.9")')
            continue
        where = ("gpus", name, "capability") if isinstance(raw, dict) else ("gpus", name)
        cc = c.version(where, facts["capability"], grammar.matches(grammar.CAPABILITY, "8.9"))
        count = facts.get("sms")
        if count is not None and (not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= 1024):
            c.fail(("gpus", name, "sms"), f"GPU {name!r}: sms {count!r} must be its SM count, 1 to 1024")
            continue
        if cc:
            gpus[gpu_key(name)] = cc
            if count is not None:
                sms[gpu_key(name)] = count
    return gpus, sms


def _targets(c: tablecheck.Checker, data: dict, gpus: dict[str, str]) -> dict[str, tuple[str, ...]]:
    targets = {}
    for name, names in c.mapping(("targets",), data.get("targets", {})).items():
        if not isinstance(names, list) or not names or not all(isinstance(g, str) and g for g in names):
            c.fail(("targets", name), f"target {name!r} must be a non-empty list of GPU names")
            continue
        # A gpus section that is itself wrong has been reported already: one problem, not two.
        unknown = [g for g in names if gpu_key(g) not in gpus] if isinstance(data.get("gpus"), dict) else []
        if unknown:
            c.fail(("targets", name), f"target {name!r} names GPUs the gpus section lacks: {', '.join(unknown)}")
            continue
        targets[str(name)] = tuple(names)
    return targets


_FAMILY = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*", re.ASCII)
CPUS = ("x86_64", "aarch64")


def _instances(
    c: tablecheck.Checker, data: dict, gpus: dict[str, str], targets: dict[str, tuple[str, ...]]
) -> dict[str, Instance]:
    """AWS instance families: each names a GPU of the gpus table, and no family shadows a GPU or a
    target of the same name (a `target` would then mean two things)."""
    out = {}
    for name, raw in c.mapping(("instances",), data.get("instances", {})).items():
        family = str(name).lower()
        raw = c.mapping(("instances", name), raw)
        gpu, cpu = raw.get("gpu"), raw.get("cpu", "x86_64")
        if not _FAMILY.fullmatch(family) or len(family) > 32:
            c.fail(("instances", name), f"instance family {name!r} must be a name such as g6e or p6-b200")
        elif set(raw) - {"gpu", "cpu"}:
            c.fail(
                ("instances", name),
                f"instance family {name!r}: only gpu and cpu, not {sorted(set(raw) - {'gpu', 'cpu'})}",
            )
        elif not isinstance(gpu, str) or (isinstance(data.get("gpus"), dict) and gpu_key(gpu) not in gpus):
            c.fail(("instances", name), f"instance family {name!r} names a GPU the gpus section lacks: {gpu!r}")
        elif cpu not in CPUS:
            c.fail(("instances", name), f"instance family {name!r}: cpu {cpu!r} is not one of {', '.join(CPUS)}")
        elif gpu_key(family) in gpus or family in {t.lower() for t in targets}:
            c.fail(("instances", name), f"instance family {name!r} is also a GPU or a target name")
        else:
            out[family] = Instance(gpu=gpu, cpu=cpu)
    return out


def _flash_attn_range(c: tablecheck.Checker, data: dict) -> SpecifierSet:
    """What plan and render accept: the builder's own SUPPORTED_FLASH_ATTN, which is the one fact.
    A table (or an override) may narrow it with flash_attn_range; it can never widen it, since
    the builder would refuse the version inside the image, after torch is installed."""
    raw = data.get("flash_attn_range")
    if raw is None:
        return SUPPORTED_FLASH_ATTN
    try:
        if not isinstance(raw, str):
            raise InvalidSpecifier(str(raw))
        return SpecifierSet(raw) & SUPPORTED_FLASH_ATTN
    except InvalidSpecifier:
        example = '">=2.5.0,<=2.8.3.post2"'
        c.fail(("flash_attn_range",), f"flash_attn_range must be a version range like {example}, not {raw!r}")
        return SUPPORTED_FLASH_ATTN


def _flash_attn(c: tablecheck.Checker, data: dict, supported: SpecifierSet) -> dict[str, FlashAttnRelease]:
    flash = {}
    for ver, raw in c.mapping(("flash_attn",), data.get("flash_attn", {})).items():
        ver = c.key(("flash_attn", ver), ver)
        raw = c.mapping(("flash_attn", ver), raw)
        sha = raw.get("sha256")
        if not (isinstance(sha, str) and grammar.SHA256.fullmatch(sha)):
            c.fail(("flash_attn", ver, "sha256"), f"flash_attn.{ver}.sha256 must be 64 hex digits")
            continue
        if ver is None:
            continue
        if Version(ver) not in supported:
            c.fail(("flash_attn", ver), f"flash-attn {ver} is outside what the builder can build ({supported})")
        flash[ver] = FlashAttnRelease(version=ver, sha256=sha, cuda_archs_env=bool(raw.get("cuda_archs_env")))
    return flash


def _pythons(c: tablecheck.Checker, data: dict) -> tuple[str, ...]:
    raw = data.get("pythons")
    if not isinstance(raw, list) or not raw:
        c.fail(("pythons",), 'pythons must be a list of quoted versions like "3.12"')
        return ()
    return tuple(p for i, p in enumerate(raw) if c.version(("pythons", i), p, _PYTHON))


def _pins_per_python(c: tablecheck.Checker, data: dict, section: str) -> dict[str, tuple[str, ...]]:
    out = {}
    for py, pins in c.mapping((section,), data.get(section, {})).items():
        key = c.key((section, py), py, _PYTHON)
        if key:
            out[key] = tablecheck.pins(c, (section, key), pins)
    return out


def build(doc: yamlfile.YamlDoc) -> Compat:
    """The validated table; every problem in it is reported at once."""
    c = tablecheck.Checker(doc)
    data = doc.data
    for key in data:
        if key not in sections():
            c.fail((key,), f"unknown section {key!r}", hint=did_you_mean(str(key), sections()))
    cuda = _cuda(c, data)
    torch = _torch(c, data, cuda)
    archs = _archs(c, data)
    gpus, sms = _gpus(c, data)
    targets = _targets(c, data, gpus)
    instances = _instances(c, data, gpus, targets)
    supported = _flash_attn_range(c, data)
    flash = _flash_attn(c, data, supported)
    releases = {m.TABLE: m.load_releases(c, data.get(m.TABLE, {})) for m in generations.MODULES if m.TABLE}
    tools = tablecheck.pins(c, ("build_tools",), data.get("build_tools", []))
    pythons = _pythons(c, data)
    per_python = _pins_per_python(c, data, "build_tools_python")
    runtime_deps = tablecheck.pins(c, ("runtime_deps",), data.get("runtime_deps", []))
    runtime_per_python = _pins_per_python(c, data, "runtime_deps_python")
    rules = c.mapping(("rules",), data.get("rules", {}))
    min_torch = c.version(("rules", "cuda13_min_torch"), rules.get("cuda13_min_torch", "2.9")) or "2.9"
    apart = rules.get("torch_libraries_apart", [])
    if not isinstance(apart, list) or not all(isinstance(a, str) and grammar.PROJECT.fullmatch(a) for a in apart):
        c.fail(("rules", "torch_libraries_apart"), "rules.torch_libraries_apart must be a list of names like cudnn")
        apart = []
    if c.problems:
        raise ConfigError(c.problems)
    return Compat(
        torch=torch,
        cuda=cuda,
        archs=archs,
        gpus=gpus,
        sms=sms,
        flash_attn=flash,
        build_tools=tools,
        cuda13_min_torch=min_torch,
        libraries_apart=tuple(apart),
        pythons=pythons,
        build_tools_python=per_python,
        runtime_deps=runtime_deps,
        runtime_deps_python=runtime_per_python,
        flash_attn_range=supported,
        targets=targets,
        instances=instances,
        releases=releases,
    )


def load(*overrides: Path) -> Compat:
    """The built-in table with each override merged over it, in order."""
    doc = yamlfile.load(DEFAULT_FILE, what="compat table")
    for override in overrides:
        extra = yamlfile.load(override, what="compat override", hint="check the path given with --compat or compat:")
        doc = yamlfile.YamlDoc(data=merge(doc.data, extra.data), file=extra.file, lines=extra.lines)
    return build(doc)

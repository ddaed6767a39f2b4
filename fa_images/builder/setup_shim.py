"""Runs flash-attn's own setup.py with its CUDA extension corrected, not sed-patched.

Usage (from the unpacked source dir): ``python -m fa_images.builder.setup_shim
fa_images_build.json bdist_wheel --dist-dir DIR``.

Text patches of setup.py (the field's ``sed`` recipe) match one release only. Instead this
wraps ``setuptools.setup`` and rewrites the ``flash_attn_2_cuda`` extension object that
every 2.x setup.py builds: the C++11 ABI define of the installed torch goes into both the
``cxx`` and the ``nvcc`` flags, and the ``-gencode`` flags become exactly the requested
archs (2.6.x hard-codes 80 and 90 and ignores FLASH_ATTN_CUDA_ARCHS), and the C++
standard becomes the one the installed torch's headers need (flash-attn <= 2.8.3.post2
hard-codes c++17, which torch >= 2.14 refuses). ``install_requires`` pins the torch the
wheel is built against (``torch==X.Y.*``), so resolvers refuse to pair it with another.
A setup.py of another shape makes this fail loudly instead of building something
unverified.
"""

from __future__ import annotations

import json
import re
import runpy
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

from . import manylinux
from .contract import COMPILE_PHASE, EXIT_SHIM_REFUSED, MILESTONE, phase_mark_line
from .settings import BuildSettings
from .shards import Shard, kernels_of

EXTENSION = "flash_attn_2_cuda"
COSTS_FILE = Path(__file__).with_name("compile_costs.json")


class ShimError(RuntimeError):
    pass


def _strip_arch_flags(flags: list[str]) -> tuple[list[str], list[str]]:
    """Removes every arch selection nvcc accepts; returns (kept, removed)."""
    kept: list[str] = []
    removed: list[str] = []
    i = 0
    while i < len(flags):
        flag = flags[i]
        if flag in ("-gencode", "--generate-code", "-arch", "--gpu-architecture") and i + 1 < len(flags):
            removed.append(flags[i + 1])
            i += 2
            continue
        if flag.startswith(("-gencode=", "--generate-code=", "-arch=", "--gpu-architecture=")):
            removed.append(flag.split("=", 1)[1])
        else:
            kept.append(flag)
        i += 1
    return kept, removed


def _strip_abi_flags(flags: list[str]) -> list[str]:
    """Drops any ABI define, also the ``-Xcompiler -D...`` form the field's recipe adds."""
    kept: list[str] = []
    skip_next = False
    for i, flag in enumerate(flags):
        if skip_next:
            skip_next = False
            continue
        if flag == "-Xcompiler" and i + 1 < len(flags) and "_GLIBCXX_USE_CXX11_ABI" in flags[i + 1]:
            skip_next = True
            continue
        if "_GLIBCXX_USE_CXX11_ABI" not in flag:
            kept.append(flag)
    return kept


# From this torch on, torch's own cpp_extension compiles extensions with C++20; its headers
# need it from 2.14 (ATen.h: "#error C++20 or later compatible compiler is required").
CXX20_FROM_TORCH = (2, 12)
FLASH_ATTN_STANDARD = "c++17"  # what flash-attn's setup.py writes, and what older torch accepts
_STANDARD = re.compile(r"c\+\+\d\d")
# How torch's BuildExtension picks the -std it adds when an extension names none.
_TORCH_DEFAULT = re.compile(r"cpp_flag_prefix \+ ['\"](c\+\+\d\d)['\"]")


def _major_minor(torch_version: str) -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", torch_version)
    if not match:
        raise ShimError(f"cannot read a torch version from {torch_version!r}")
    return int(match.group(1)), int(match.group(2))


def cxx_standard(torch_version: str, torch_default: str | None = None) -> tuple[str, str]:
    """The ``-std`` value to compile flash-attn with against ``torch_version``, and why.

    From torch 2.12 on, torch's own cpp_extension default (``torch_default``, read from the
    installed torch; c++20 when it cannot be read); before that flash-attn's own c++17.
    """
    version = ".".join(map(str, _major_minor(torch_version)))
    if _major_minor(torch_version) < CXX20_FROM_TORCH:
        return FLASH_ATTN_STANDARD, f"torch {version} < 2.12: flash-attn's own {FLASH_ATTN_STANDARD}"
    if torch_default is not None and _STANDARD.fullmatch(torch_default):
        return torch_default, f"torch {version} >= 2.12: torch's cpp_extension default, read from torch"
    return "c++20", f"torch {version} >= 2.12: torch's cpp_extension default since 2.12 (not readable here)"


def torch_default_standard(cpp_extension_source: str | None = None) -> str | None:
    """The ``-std`` torch's BuildExtension adds to an extension that names none, or None.

    torch exposes no attribute for it; it is a literal in ``BuildExtension.build_extensions``.
    Read from the installed torch, or from the text of a ``torch/utils/cpp_extension.py``.
    """
    if cpp_extension_source is None:
        try:
            import inspect

            from torch.utils import cpp_extension

            cpp_extension_source = inspect.getsource(cpp_extension.BuildExtension)
        except (ImportError, OSError, TypeError):
            return None
    found = set(_TORCH_DEFAULT.findall(cpp_extension_source))
    return found.pop() if len(found) == 1 else None


def _strip_std_flags(flags: Sequence[str]) -> list[str]:
    """Drops every C++ standard selection: ``-std=X``, ``--std X``, ``-Xcompiler -std=X`` and friends."""
    kept: list[str] = []
    i = 0
    while i < len(flags):
        flag = flags[i]
        if flag in ("-std", "--std") and i + 1 < len(flags):
            i += 2
            continue
        if flag in ("-Xcompiler", "--compiler-options") and i + 1 < len(flags) and _is_std(flags[i + 1]):
            i += 2
            continue
        if not _is_std(flag):
            kept.append(flag)
        i += 1
    return kept


def _is_std(flag: str) -> bool:
    for prefix in ("-Xcompiler=", "--compiler-options="):
        if flag.startswith(prefix):
            flag = flag[len(prefix) :]
    return flag.startswith(("-std=", "--std="))


def correct_extension(ext: Any, settings: BuildSettings, torch_default: str | None = None) -> str:
    """Rewrites one CUDAExtension's flags in place; returns a one-line account."""
    args = getattr(ext, "extra_compile_args", None)
    if not isinstance(args, dict) or not {"cxx", "nvcc"} <= set(args):
        raise ShimError(
            f"{EXTENSION} in this setup.py has no {{'cxx': ..., 'nvcc': ...}} compile args; "
            f"fa-images cannot correct flash-attn {settings.flash_attn}"
        )
    abi = settings.abi_define()
    standard, why = cxx_standard(settings.torch, torch_default)
    asked = sorted({f for f in [*args["cxx"], *args["nvcc"]] if _is_std(f)})
    std = f"-std={standard}"
    args["cxx"] = _strip_std_flags(_strip_abi_flags(list(args["cxx"]))) + [std, abi]
    nvcc, removed = _strip_arch_flags(_strip_std_flags(_strip_abi_flags(list(args["nvcc"]))))
    args["nvcc"] = nvcc + settings.gencode_flags() + [std, abi]
    return (
        f"{EXTENSION}: {abi}, archs {','.join(settings.archs)}{' +PTX' if settings.ptx else ''}"
        f" (setup.py asked for: {', '.join(removed) or 'none'}); {std} ({why}; setup.py asked for: "
        f"{', '.join(asked) or 'none'})"
    )


def torch_pin(torch_version: str) -> str:
    """``torch==X.Y.*``: the torch series a wheel built against ``torch_version`` runs with.

    The GPU wheel indexes pin flash-attn wheels this way; torch's C++ ABI is not stable across
    minor releases, so an X.Y wheel can fail to import (undefined symbols) next to X.Y+1.
    """
    major, minor = _major_minor(torch_version)
    return f"torch=={major}.{minor}.*"


def pin_torch_requirement(install_requires: str | Sequence[str] | None, torch_version: str) -> tuple[list[str], str]:
    """``install_requires`` with its torch requirement replaced by the pin; and a one-line account."""
    if isinstance(install_requires, str):
        install_requires = install_requires.splitlines()
    pin = torch_pin(torch_version)
    kept: list[str] = []
    replaced: list[str] = []
    for line in install_requires or []:
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            name = Requirement(text).name
        except InvalidRequirement as exc:
            raise ShimError(f"setup.py's install_requires has {text!r}, which is not a requirement: {exc}") from None
        if re.sub(r"[-_.]+", "-", name).lower() == "torch":
            replaced.append(text)
        else:
            kept.append(text)
    return [pin, *kept], f"requires {pin} (setup.py asked for: {', '.join(replaced) or 'no torch'})"


def expected_seconds(source: str, costs: dict) -> float:
    """What compiling ``source`` is expected to take: its own measurement, else its kind's, else the median."""
    stem = Path(source).stem
    if stem in costs["kernels"]:
        return costs["kernels"][stem]
    return next((k["seconds"] for k in costs["kinds"] if k["contains"] in stem), costs["default"])


def longest_first(sources: list[str], costs: dict | None = None) -> list[str]:
    """``sources`` in the order ninja should start them: the longest first, so none starts last.

    setup.py lists the split-KV kernels, the longest, at the end; started last, they left a
    long tail on 64 cores (bench/gpu_build.md). The sort is stable: equal costs keep their order.
    """
    costs = costs or json.loads(COSTS_FILE.read_text())
    return sorted(sources, key=lambda s: -expected_seconds(s, costs))


def _compile_shard_only(settings: BuildSettings) -> None:
    """``wheel --shard I/N``: ninja compiles only this shard's kernels, then the build stops.

    The kernels go through the very call the full build makes, with the same flags and paths,
    so their cache keys are the final run's; nothing is linked and no wheel is made.
    """
    from torch.utils.cpp_extension import BuildExtension

    costs = json.loads(COSTS_FILE.read_text())
    shard = Shard(settings.shard, settings.shards)
    build_extension = BuildExtension.build_extension

    def compile_shard(self: Any, ext: Any) -> Any:
        compile_ = self.compiler.compile

        def compile_kernels(sources: list[str], *args: Any, **kwargs: Any) -> Any:
            mine = kernels_of(list(sources), shard, lambda s: expected_seconds(s, costs))
            print(f"{MILESTONE}shard {shard}: {len(mine)} kernels: {' '.join(Path(s).name for s in mine)}", flush=True)
            if mine:
                compile_(mine, *args, **kwargs)
            print(f"{MILESTONE}shard {shard}: compiled into the cache; nothing linked", flush=True)
            sys.exit(0)  # no link, no wheel: the final run links every kernel from the cache

        self.compiler.compile = compile_kernels
        return build_extension(self, ext)

    BuildExtension.build_extension = compile_shard


def _schedule_longest_first() -> None:
    """Hands ninja the sources longest first.

    Reordering ``ext.sources`` is not enough: distutils' build_extension sorts them "to make
    the build reproducible" (measured: the split-KV kernels still started last). So the order
    is set on the way into the compiler, whose ninja file lists them, and ninja starts ready
    steps in that order. The link, and so the .so, is the same set of objects.
    """
    from torch.utils.cpp_extension import BuildExtension

    build_extension = BuildExtension.build_extension

    def ordered(self: Any, ext: Any) -> Any:
        compile_ = self.compiler.compile  # BuildExtension's ninja compile, set per build

        def compile_longest_first(sources: list[str], *args: Any, **kwargs: Any) -> Any:
            return compile_(longest_first(list(sources)), *args, **kwargs)

        self.compiler.compile = compile_longest_first
        try:
            return build_extension(self, ext)
        finally:
            self.compiler.compile = compile_

    BuildExtension.build_extension = ordered


def _mark(phase: str) -> None:
    """Phase ``phase`` of setup.py ends now; the builder reads the line into its timeline."""
    print(phase_mark_line(phase, time.time()), flush=True)


def _timed(phase_before: str, phase: str, call: Callable[..., Any]) -> Callable[..., Any]:
    """``call``, marking the end of what ran before it (``phase_before``) and its own end (``phase``)."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        _mark(phase_before)
        try:
            return call(*args, **kwargs)
        finally:
            _mark(phase)

    return timed


def _time_phases() -> None:
    """Marks the end of each setuptools command, and of the compile, the link and the wheel's zip in them.

    Without these, everything but ninja's own steps is one unexplained sum (about 46 s of a
    1305 s build on the GPU machine).
    """
    from setuptools.dist import Distribution
    from torch.utils.cpp_extension import BuildExtension

    run_command = Distribution.run_command

    def run_timed(self: Any, command: str) -> Any:
        try:
            return run_command(self, command)
        finally:
            _mark(f"setup.py {command}")

    Distribution.run_command = run_timed
    build_extension = BuildExtension.build_extension

    def build_timed(self: Any, ext: Any) -> Any:
        compiler = self.compiler
        compile_, link = compiler.compile, compiler.link_shared_object
        compiler.compile = _timed("setup.py build_ext", COMPILE_PHASE, compile_)
        compiler.link_shared_object = _timed("setup.py build_ext", "link", link)
        try:
            return build_extension(self, ext)
        finally:
            compiler.compile, compiler.link_shared_object = compile_, link

    BuildExtension.build_extension = build_timed
    try:
        from wheel.wheelfile import WheelFile  # what setuptools' bdist_wheel writes the wheel with
    except ImportError:
        return
    WheelFile.write_files = _timed("setup.py bdist_wheel", "wheel zip", WheelFile.write_files)


def _tag_manylinux_when_zipped() -> None:
    """bdist_wheel names the wheel with the manylinux tag its extension allows (manylinux.py).

    Retagging the finished wheel (``manylinux.tag_wheel``, which stays as the fallback) inflates
    and deflates the whole extension again, about 200 MB for flash-attn: seconds of every build
    for a new name. Here the tag is known before the zip is written, from the installed extension.
    """
    try:
        from setuptools.command.bdist_wheel import bdist_wheel
    except ImportError:  # setuptools < 70.1: the builder retags the finished wheel
        return
    get_tag = bdist_wheel.get_tag
    decided: dict[str, str] = {}  # get_tag runs twice (name, WHEEL file); decide and say it once

    def manylinux_tag(self: Any) -> tuple[str, str, str]:
        impl, abi, platform = get_tag(self)
        if platform != "linux_x86_64":
            return impl, abi, platform
        if "platform" not in decided:
            decided["platform"] = _platform_of(Path(self.bdist_dir), platform)
        return impl, abi, decided["platform"]

    bdist_wheel.get_tag = manylinux_tag


def _platform_of(bdist_dir: Path, platform: str) -> str:
    """The manylinux platform the installed extension in ``bdist_dir`` allows, else ``platform``."""
    found = sorted(bdist_dir.glob(f"{EXTENSION}.*.so"))
    if len(found) != 1:
        return platform
    policy, why = manylinux.policy_of(found[0])
    if policy is None:
        print(f"{MILESTONE}platform tag stays {platform}: the extension {why}", flush=True)
        return platform
    left_out = "torch's and CUDA's libraries left out"
    print(f"{MILESTONE}platform tag {policy}_x86_64: the extension {why} ({left_out})", flush=True)
    return f"{policy}_x86_64"


def _pin_torch_abi(settings: BuildSettings) -> None:
    """The settings must describe the torch that is importable here.

    Older torch's BuildExtension derived its own ABI define from torch._C, which flash-attn's
    FLASH_ATTENTION_FORCE_CXX11_ABI overwrites; torch >= 2.9 adds none, so the shim's define
    is the one that takes effect. The builder unsets that variable either way.
    """
    import torch

    if bool(torch._C._GLIBCXX_USE_CXX11_ABI) != settings.cxx11_abi:
        raise ShimError(
            f"torch reports cxx11_abi={bool(torch._C._GLIBCXX_USE_CXX11_ABI)} but the build was "
            f"prepared for {settings.cxx11_abi}; prepare again with this torch"
        )


def run(settings_path: Path, setup_args: list[str]) -> None:
    import setuptools

    settings = BuildSettings.read(settings_path)
    _pin_torch_abi(settings)
    torch_default = torch_default_standard()
    real_setup = setuptools.setup
    corrected: list[str] = []

    def setup(**kwargs: Any) -> Any:
        _mark("setup.py start")  # the interpreter, torch and setup.py's own code up to setup()
        for ext in kwargs.get("ext_modules") or []:
            if getattr(ext, "name", None) == EXTENSION:
                corrected.append(correct_extension(ext, settings, torch_default))
                corrected.append(f"{len(ext.sources)} sources, longest first ({COSTS_FILE.name})")
        if not corrected:
            raise ShimError(
                f"setup.py of flash-attn {settings.flash_attn} defines no {EXTENSION} extension "
                "(was FLASH_ATTENTION_SKIP_CUDA_BUILD set?); refusing to build a wheel without kernels"
            )
        kwargs["install_requires"], pinned = pin_torch_requirement(kwargs.get("install_requires"), settings.torch)
        corrected.append(pinned)
        print(f"{MILESTONE}{'; '.join(corrected)}", flush=True)
        import torch  # setup.py may have flipped the attribute at import time

        torch._C._GLIBCXX_USE_CXX11_ABI = settings.cxx11_abi
        return real_setup(**kwargs)

    setuptools.setup = setup
    _time_phases()
    _tag_manylinux_when_zipped()
    _schedule_longest_first()
    if settings.shards:
        _compile_shard_only(settings)  # wraps the longest-first compile: a shard's kernels keep that order
    source_dir = Path.cwd()
    sys.argv = ["setup.py", *setup_args]
    sys.path.insert(0, str(source_dir))
    runpy.run_path(str(source_dir / "setup.py"), run_name="__main__")


if __name__ == "__main__":
    try:
        run(Path(sys.argv[1]), sys.argv[2:])
    except ShimError as exc:
        print(f"{MILESTONE}error: {exc}", file=sys.stderr, flush=True)
        sys.exit(EXIT_SHIM_REFUSED)

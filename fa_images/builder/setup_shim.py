"""Runs flash-attn's own setup.py with its CUDA extension corrected, not sed-patched.

Usage (from the unpacked source dir): ``python -m fa_images.builder.setup_shim
fa_images_build.json bdist_wheel --dist-dir DIR``.

Text patches of setup.py (the field's ``sed`` recipe) match one release only. Instead this
wraps ``setuptools.setup`` and rewrites the ``flash_attn_2_cuda`` extension object that
every 2.x setup.py builds: the C++11 ABI define of the installed torch goes into both the
``cxx`` and the ``nvcc`` flags, and the ``-gencode`` flags become exactly the requested
archs (2.6.x hard-codes 80 and 90 and ignores FLASH_ATTN_CUDA_ARCHS). A setup.py of
another shape makes this fail loudly instead of building something unverified.
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path
from typing import Any

from .contract import EXIT_SHIM_REFUSED, MILESTONE
from .settings import BuildSettings

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


def correct_extension(ext: Any, settings: BuildSettings) -> str:
    """Rewrites one CUDAExtension's flags in place; returns a one-line account."""
    args = getattr(ext, "extra_compile_args", None)
    if not isinstance(args, dict) or not {"cxx", "nvcc"} <= set(args):
        raise ShimError(
            f"{EXTENSION} in this setup.py has no {{'cxx': ..., 'nvcc': ...}} compile args; "
            f"fa-images cannot correct flash-attn {settings.flash_attn}"
        )
    abi = settings.abi_define()
    args["cxx"] = _strip_abi_flags(list(args["cxx"])) + [abi]
    nvcc, removed = _strip_arch_flags(_strip_abi_flags(list(args["nvcc"])))
    args["nvcc"] = nvcc + settings.gencode_flags() + [abi]
    return (
        f"{EXTENSION}: {abi}, archs {','.join(settings.archs)}{' +PTX' if settings.ptx else ''}"
        f" (setup.py asked for: {', '.join(removed) or 'none'})"
    )


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
    real_setup = setuptools.setup
    corrected: list[str] = []

    def setup(**kwargs: Any) -> Any:
        for ext in kwargs.get("ext_modules") or []:
            if getattr(ext, "name", None) == EXTENSION:
                corrected.append(correct_extension(ext, settings))
                corrected.append(f"{len(ext.sources)} sources, longest first ({COSTS_FILE.name})")
        if not corrected:
            raise ShimError(
                f"setup.py of flash-attn {settings.flash_attn} defines no {EXTENSION} extension "
                "(was FLASH_ATTENTION_SKIP_CUDA_BUILD set?); refusing to build a wheel without kernels"
            )
        print(f"{MILESTONE}{'; '.join(corrected)}", flush=True)
        import torch  # setup.py may have flipped the attribute at import time

        torch._C._GLIBCXX_USE_CXX11_ABI = settings.cxx11_abi
        return real_setup(**kwargs)

    setuptools.setup = setup
    _schedule_longest_first()
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

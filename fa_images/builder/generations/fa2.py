"""flash-attn 2 in the builder: PyPI's sdist (fetched or found, sha256-checked), compiled through the
setup.py shim for exactly the archs asked, with a +label naming the torch series, CUDA and C++ ABI."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import source
from ..settings import local_version_label
from .steps import PreparedSource, SourceRequest

if TYPE_CHECKING:
    from ..environment import NvccInfo, TorchInfo
    from ..settings import BuildSettings
    from ..wheelfile import Wheel

# Its +label, with the GPU class where its matrix built several of one torch ('.sm80.120').
LABEL = re.compile(
    r"cu(?P<cuda>\d+)torch(?P<torch>\d+\.\d+)cxx11abi(?P<abi>true|false)(?:\.sm(?P<gpu_class>\d+(?:\.\d+)*))?",
    re.IGNORECASE,
)
FLAGS: tuple[str, ...] = ()  # its settings are the builder's own flags (--archs, --ptx, --label-archs)


def label(local: str) -> re.Match[str] | None:
    return LABEL.search(local)


def from_flags(args: argparse.Namespace) -> tuple[dict[str, Any] | None, tuple[str, ...]]:
    """(no knobs, the archs to compile): ``--archs``, 80 where none is given."""
    if args.flash_attn is not None:
        source.check_supported(args.flash_attn, allow_untested=args.allow_untested)
    return None, args.archs or ("80",)


def add_wheel_flags(parser: argparse.ArgumentParser) -> None:
    """Its flags are the builder's own."""


def prepare_source(request: SourceRequest, torch: TorchInfo) -> PreparedSource:
    """The sdist from a local file, ``--sources-dir`` or the index, checked and unpacked."""
    if request.version is not None:
        source.check_supported(request.version, allow_untested=request.allow_untested)
    sdist_path, sha = source.obtain_sdist(
        version=request.version,
        sdist=request.sdist,
        dest_dir=request.work_dir / "sdists",
        sha256=request.sha256,
        index_url=request.index_url,
        sources_dir=request.sources_dir,
    )
    tree = source.unpack(sdist_path, request.work_dir / "src", sha)
    if request.version is None:
        source.check_supported(tree.version, allow_untested=request.allow_untested)
    archs = request.archs if request.label_archs else ()
    local = local_version_label(cuda=torch.cuda, torch=torch.version, cxx11_abi=torch.cxx11_abi, archs=archs)
    return PreparedSource(tree, request.archs, local if tree.honours_local_version else None, ptx=True, knobs=None)


def setup_command(python: str, src: Path, dist: Path, settings_file: Path) -> list[str]:
    """setup.py through the shim, which reads its settings file and puts the wheel into ``dist``."""
    return [python, "-m", "fa_images.builder.setup_shim", str(settings_file), "bdist_wheel", "--dist-dir", str(dist)]


def build_environment(settings: BuildSettings, nvcc: NvccInfo) -> dict[str, str]:
    """Its setup.py's environment: the archs, the jobs and the label, none of a caller's that would
    change what gets built."""
    env = dict(os.environ)
    for var in ("FLASH_ATTENTION_FORCE_CXX11_ABI", "FLASH_ATTENTION_SKIP_CUDA_BUILD", "FLASH_ATTN_LOCAL_VERSION"):
        env.pop(var, None)  # each would silently change what gets built
    env.update(
        FLASH_ATTENTION_FORCE_BUILD="TRUE",  # never download a prebuilt wheel
        FLASH_ATTN_CUDA_ARCHS=";".join(settings.archs),
        TORCH_CUDA_ARCH_LIST=";".join(f"{a[:-1]}.{a[-1]}" for a in settings.archs),
        MAX_JOBS=str(settings.max_jobs),
        NVCC_THREADS=str(settings.nvcc_threads),
        CUDA_HOME=str(nvcc.cuda_home),
        PATH=f"{nvcc.path.parent}{os.pathsep}{env.get('PATH', '')}",
        PYTHONUNBUFFERED="1",
    )
    if settings.local_version:
        env["FLASH_ATTN_LOCAL_VERSION"] = settings.local_version
    if settings.source_date_epoch is not None:
        # A user's own SOURCE_DATE_EPOCH wins, as the reproducible-builds convention has it.
        env.setdefault("SOURCE_DATE_EPOCH", str(settings.source_date_epoch))
    return env


def setup_environment(settings: BuildSettings, nvcc: NvccInfo) -> dict[str, str]:
    env = build_environment(settings, nvcc)
    # The shim is imported from this package wherever it lives (site-packages or a build context).
    package_root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    return env


def check_wheel(report: Any, wheel: Wheel) -> None:
    """Its build is all in its label and the settings: nothing more in the wheel to read."""


def check_label(report: Any, label: re.Match[str] | None, torch_here: dict) -> None:
    """The wheel's +label (torch X.Y, CUDA, ABI) against the torch it is next to: a wheel built for
    another torch fails there even when its symbols happen to resolve."""
    if not torch_here:
        return
    if label is None:
        report.add("label", "skip", "no +cuXYZtorchX.Ycxx11abiBOOL label to compare with torch")
        return
    here, cuda = torch_here["torch"], torch_here.get("cuda")
    series = ".".join(here.split("+")[0].split(".")[:2])
    said_cuda, said_abi = label["cuda"], label["abi"].lower() == "true"
    wrong = []
    if label["torch"] != series:
        wrong.append(f"torch {label['torch']}, not {series}")
    if cuda is None:
        wrong.append(f"CUDA {said_cuda}, but torch {here} is a CPU build")
    elif said_cuda[:2] != cuda.replace(".", "")[:2]:  # cu12 and cu128 are both CUDA 12
        wrong.append(f"CUDA {said_cuda}, not {cuda}")
    if said_abi != torch_here["cxx11_abi"]:
        wrong.append(f"cxx11_abi={said_abi}, not {torch_here['cxx11_abi']}")
    text = label.group(0)
    if wrong:
        report.add("label", "fail", f"{text} says {'; '.join(wrong)}: built for another torch than {here}")
    else:
        report.add("label", "pass", f"{text} fits torch {here} (CUDA {cuda}, cxx11_abi={torch_here['cxx11_abi']})")


def add_commands(sub: argparse._SubParsersAction) -> None:
    """It adds no command of its own to the builder."""

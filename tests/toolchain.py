"""Build toolchains for tests that compile flash-attn-shaped CUDA extensions.

Everything lands in a per-user cache (``$FA_IMAGES_TEST_CACHE`` or
``~/.cache/fa-images-tests``). Each helper finishes by writing a marker that
records what it built, so a second call returns at once; a half-finished
attempt (no marker) is redone from scratch. Helpers hold a file lock while
they build, so parallel test workers do not trip over each other.

Only the standard library is used; downloads go through pip and apt-get.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from fa_images.config import compat

TORCH_VERSION = "2.9.1"
# Build-time helpers that flash-attn's setup.py imports, plus einops, which
# flash-attn (and the tiny fixture) lists in install_requires.
# The builder's pinned build tools, as the rendered Dockerfiles install them, plus the tiny
# sdist's own requirement.
TORCH_EXTRAS = (*compat.load().build_tools, "einops")
MANYLINUX_PLATFORMS = (
    "manylinux2014_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_28_x86_64",
)
MARKER = ".fa-images-ready"


@dataclass(frozen=True)
class CudaRelease:
    """Pinned sources of one CUDA toolkit release.

    NVIDIA's cu12 wheels on PyPI carry the headers, cudart, ptxas, libnvvm and
    libdevice, but not the compiler driver: no nvcc, cicc, cudafe++, fatbinary
    or nvlink (only CUDA 13's wheels do). Those binaries come from Debian's
    non-free ``nvidia-cuda-toolkit``, which repackages NVIDIA's builds
    unmodified; Debian only has it up to 12.4 in a stable suite, so 12.4 is
    the newest CUDA 12 that can be assembled from package registries.
    """

    version: str  # "12.4": what `nvcc --version` reports as its release
    nvcc: str  # nvidia-cuda-nvcc-cu12; also the Debian toolkit's upstream version
    runtime: str  # nvidia-cuda-runtime-cu12
    cccl: str  # nvidia-cuda-cccl-cu12
    debian_suite: str
    debian_toolkit: str  # exact Debian version of nvidia-cuda-toolkit


CUDA_RELEASES: dict[str, CudaRelease] = {
    "12.4": CudaRelease(
        version="12.4",
        nvcc="12.4.131",
        runtime="12.4.127",
        # 12.4.127 itself was yanked as broken (no headers).
        cccl="12.4.127.post1",
        debian_suite="trixie",
        debian_toolkit="12.4.131~12.4.1-2",
    ),
}


@dataclass(frozen=True)
class CudaWheelRelease:
    """A CUDA toolkit made of NVIDIA's wheels alone: from CUDA 13 on they carry the compiler
    driver too (nvcc, cicc, cudafe++, fatbinary, nvlink), static cudart and cudadevrt, so nvcc
    links as it does by default. 13.0 is the GPU machine's own (facts.md)."""

    version: str  # "13.0": what `nvcc --version` reports as its release
    nvcc: str  # what it reports as its version
    wheels: tuple[tuple[str, str], ...]  # (PyPI name, version), all laid out as nvidia/cu13/...


CUDA_WHEEL_RELEASES: dict[str, CudaWheelRelease] = {
    "13.0": CudaWheelRelease(
        version="13.0",
        nvcc="13.0.88",
        wheels=(
            ("nvidia-cuda-nvcc", "13.0.88"),  # nvcc, ptxas, fatbinary, nvlink, cudafe++
            ("nvidia-cuda-crt", "13.0.88"),  # crt/ headers
            ("nvidia-nvvm", "13.0.88"),  # cicc, libnvvm, libdevice
            ("nvidia-cuda-runtime", "13.0.96"),
            ("nvidia-cuda-cccl", "13.0.85"),  # under include/cccl from 13 on
        ),
    ),
}

# Driver binaries taken from the Debian package, by their path inside it.
_DEBIAN_TOOLS = {
    "usr/lib/nvidia-cuda-toolkit/bin/nvcc": "bin/nvcc",
    "usr/lib/nvidia-cuda-toolkit/bin/cicc": "nvvm/bin/cicc",
    "usr/lib/nvidia-cuda-toolkit/bin/crt/link.stub": "bin/crt/link.stub",
    "usr/lib/nvidia-cuda-toolkit/bin/crt/prelink.stub": "bin/crt/prelink.stub",
    "usr/bin/cudafe++": "bin/cudafe++",
    "usr/bin/fatbinary": "bin/fatbinary",
    "usr/bin/nvlink": "bin/nvlink",
    "usr/bin/bin2c": "bin/bin2c",
    "usr/bin/nvprune": "bin/nvprune",
    "usr/bin/cuobjdump": "bin/cuobjdump",
    "usr/bin/cu++filt": "bin/cu++filt",
}

# The stock profile of a flat (non-"targets/") CUDA install: every path is
# relative to the directory nvcc runs from, so the tree can live anywhere.
_NVCC_PROFILE = """\
TOP              = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/$(_NVVM_BRANCH_)/libdevice
LD_LIBRARY_PATH += $(TOP)/lib64:
PATH            += $(TOP)/$(_NVVM_BRANCH_)/bin:$(_HERE_):
INCLUDES        +=  "-I$(TOP)/include" $(_SPACE_)
LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/lib64/stubs" "-L$(TOP)/lib64"
CUDAFE_FLAGS    +=
PTXAS_FLAGS     +=
"""
# CUDA 13 keeps CCCL (thrust, cub, libcu++) in include/cccl, searched as a system directory.
_NVCC13_PROFILE = _NVCC_PROFILE + 'SYSTEM_INCLUDES +=  "-isystem" "$(TOP)/include/cccl" $(_SPACE_)\n'

_SMOKE_CU = """\
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <thrust/device_vector.h>
__global__ void scale(__half* x, float s) { x[threadIdx.x] = __float2half(__half2float(x[threadIdx.x]) * s); }
int main() { thrust::device_vector<int> v(1); scale<<<1, 1>>>(nullptr, 2.f); return cudaGetLastError(); }
"""


def cache_dir() -> Path:
    """Root of the test cache: ``$FA_IMAGES_TEST_CACHE`` or ``~/.cache/fa-images-tests``."""
    env = os.environ.get("FA_IMAGES_TEST_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "fa-images-tests"


def torch_wheelhouse(python_version: str = "3.11") -> Path:
    """Wheels of torch and its dependencies (plus build helpers) for one CPython.

    The directory suits ``pip install --no-index --find-links``. The first call
    downloads about 3.5 GB.
    """
    tag = _cp_tag(python_version)
    dest = cache_dir() / f"wheelhouse-torch{TORCH_VERSION}-{tag}"
    # The runtime image's pins too (numpy, per Python): the engine tier's builds install them offline.
    requirements = [f"torch=={TORCH_VERSION}", *TORCH_EXTRAS, *compat.load().runtime_deps_for(python_version)]
    spec = {
        "requirements": requirements,
        "python_version": python_version,
        "platforms": list(MANYLINUX_PLATFORMS),
    }
    if _is_ready(dest, spec):
        return dest
    with _lock(dest):
        if _is_ready(dest, spec):
            return dest
        dest.mkdir(parents=True, exist_ok=True)
        _seed_pure_wheels(dest)
        _log(f"downloading torch {TORCH_VERSION} and dependencies for {tag} into {dest} (~3.5 GB)")
        _pip_download(python_version, dest, requirements)
        _mark(dest, spec)
    return dest


def torch_release(version: str, python_version: str = "3.11") -> Path:
    """The wheels that a torch release other than TORCH_VERSION adds to torch_wheelhouse(): its
    own, and those of its dependencies that differ (torch 2.10.0 beside 2.9.1: torch, triton,
    nvshmem and the CUDA Python bindings, about 1.5 GB). For a test in which an index gains a
    release. Every other requirement is held at the wheelhouse's own version, so that an index
    gaining these files resolves TORCH_VERSION exactly as before."""
    base = torch_wheelhouse(python_version)
    tag = _cp_tag(python_version)
    dest = cache_dir() / f"release-torch{version}-{tag}"
    spec = {"torch": version, "python_version": python_version, "beside": str(base)}
    if _is_ready(dest, spec):
        return dest
    with _lock(dest):
        if _is_ready(dest, spec):
            return dest
        # pip skips what is already in its --dest: the download goes into links of the wheelhouse.
        staging = dest.with_name(dest.name + ".download")
        staging.mkdir(parents=True, exist_ok=True)
        held = []
        for wheel in base.glob("*.whl"):
            if not (staging / wheel.name).exists():
                os.link(wheel, staging / wheel.name)
            name, _, rest = wheel.name.partition("-")
            if name.lower() not in {"torch", "triton"} and not name.lower().startswith(("nvidia_", "cuda_")):
                held.append(f"{name}=={rest.partition('-')[0]}")
        constraints = staging / "constraints.txt"
        constraints.write_text("\n".join(sorted(held)) + "\n")
        _log(f"downloading torch {version} for {tag} beside {base} (~1.5 GB)")
        _pip_download(python_version, staging, [f"torch=={version}"], "--constraint", str(constraints))
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir()
        for wheel in staging.glob("*.whl"):
            if not (base / wheel.name).exists():
                os.replace(wheel, dest / wheel.name)
        shutil.rmtree(staging)
        _mark(dest, spec)
    return dest


FA4_VERSION = "4.0.0b36"
FA4_BINDINGS = ["cuda-bindings==13.5.0", "cuda-pathfinder==1.9.1"]


def fa4_site(python_version: str = "3.11") -> Path:
    """A site directory with FlashAttention-4 and the set compat.yaml pins for it (CUDA 13), less
    the DSL's CUDA 12 libraries (which its compile does not load): next to the toolchain venv's
    torch, through ``site.addsitedir`` (the DSL adds its packages with a .pth file). About 100 MB
    downloaded once."""
    pins = compat.load().releases["flash_attn_4"][FA4_VERSION].pins["13"]
    # A CUDA 13 torch brings the CUDA Python bindings the DSL needs; the toolchain's 2.9.1 (CUDA 12.8) does not.
    wanted = [p for p in pins if not p.startswith("nvidia-cutlass-dsl-libs-cu12")] + FA4_BINDINGS
    dest = cache_dir() / f"fa4-site-{FA4_VERSION}-{_cp_tag(python_version)}"
    spec = {"pins": wanted, "python_version": python_version, "bytecode": True}
    if _is_ready(dest, spec):
        return dest / "site"
    with _lock(dest):
        if _is_ready(dest, spec):
            return dest / "site"
        wheels = dest / "wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        _log(f"downloading flash-attn-4 {FA4_VERSION} and its pinned set for {_cp_tag(python_version)} (~100 MB)")
        _pip_download(python_version, wheels, wanted, "--no-deps")
        shutil.rmtree(dest / "site", ignore_errors=True)
        # With its bytecode (torch_venv says why): each import of the DSL took about 5 CPU s more without.
        command = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index"]
        _run([*command, "--target", str(dest / "site"), *map(str, sorted(wheels.glob("*.whl")))])
        _mark(dest, spec)
    return dest / "site"


def _pip_download(python_version: str, dest: Path, requirements: Sequence[str], *options: str) -> None:
    """Manylinux x86_64 wheels of ``requirements`` for one CPython into ``dest`` (pip keeps what is
    there already, so an interrupted download resumes)."""
    platform = ["--python-version", python_version, "--implementation", "cp", *_platform_args()]
    command = [sys.executable, "-m", "pip", "download", "--only-binary=:all:", *platform, *options]
    _run([*command, "--dest", str(dest), *requirements], progress=True)


def _seed_pure_wheels(dest: Path) -> None:
    """The pure wheels of the wheelhouses of the same torch for other Pythons, linked into
    ``dest`` (``link_pure_wheels``)."""
    for other in cache_dir().glob(f"wheelhouse-torch{TORCH_VERSION}-cp*"):
        if other != dest and (other / MARKER).is_file():  # a complete download
            link_pure_wheels(other, dest)


def link_pure_wheels(source: Path, dest: Path) -> None:
    """Hard-links the wheels of ``source`` that fit every CPython (``py3-none``: the CUDA
    libraries, most of torch's 3.5 GB) into ``dest`` where it has none of that name: `pip
    download --dest` takes them as downloaded, and copies nothing."""
    for wheel in source.glob("*-py3-none-*.whl"):
        if not (dest / wheel.name).exists():
            os.link(wheel, dest / wheel.name)


def torch_venv(python: str = sys.executable) -> Path:
    """A venv with torch and the build helpers, installed offline from the wheelhouse.

    Returns the venv directory; its interpreter is ``<venv>/bin/python``.
    """
    python_version = _run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture=True,
    ).strip()
    wheelhouse = torch_wheelhouse(python_version)
    dest = cache_dir() / f"venv-torch{TORCH_VERSION}-{_cp_tag(python_version)}"
    requirements = [f"torch=={TORCH_VERSION}", *TORCH_EXTRAS]
    spec = {
        "python": os.path.realpath(python),
        "wheelhouse": str(wheelhouse),
        "requirements": requirements,
        "installer": "uv",
        "bytecode": True,
    }
    if _is_ready(dest, spec) and (dest / "bin" / "python").exists():
        return dest
    with _lock(dest):
        if _is_ready(dest, spec) and (dest / "bin" / "python").exists():
            return dest
        # A venv is not relocatable (scripts hard-code its path), so it is
        # built in place and only the marker says it is complete.
        shutil.rmtree(dest, ignore_errors=True)
        _log(f"creating {dest} (torch {TORCH_VERSION}, offline from {wheelhouse})")
        _run([python, "-m", "venv", str(dest)])
        # uv, not pip: it unpacks the wheels side by side (torch 2.9.1 into a new venv, with its
        # bytecode: 36 s against pip's 71 s here). Its cache is a scratch directory beside the venv,
        # whose files it hard-links into the venv and which goes after. The bytecode is compiled
        # here, once: where the environment sets PYTHONDONTWRITEBYTECODE (some CI images do),
        # Python writes none at import, and each of the suite's hundreds of processes on this venv
        # compiled torch's modules anew (1 to 2 s each).
        with tempfile.TemporaryDirectory(dir=cache_dir(), prefix=".uv-cache-") as uv_cache:
            _run(
                [
                    sys.executable, "-m", "uv", "pip", "install", "--quiet", "--no-config",
                    "--python", str(dest / "bin" / "python"),
                    "--no-index", "--find-links", str(wheelhouse),
                    "--link-mode", "hardlink", "--cache-dir", uv_cache, "--compile-bytecode",
                    *requirements,
                ],
                env={k: v for k, v in _offline_pip_env().items() if not k.startswith("UV_")},
                progress=True,
            )  # fmt: skip
        _run([str(dest / "bin" / "python"), "-c", "import torch, ninja, wheel, psutil"])
        _mark(dest, spec)
    return dest


# Asked in a child, not through fa_images: the tests compare fa_images' own reading with it.
_TORCH_PROBE = (
    "import json, sys, torch; print(json.dumps({'version': torch.__version__, 'cuda': torch.version.cuda, "
    "'abi': bool(torch._C._GLIBCXX_USE_CXX11_ABI), 'gpu': torch.cuda.is_available(), "
    "'cp': 'cp%d%d' % sys.version_info[:2]}))"
)


def torch_facts(python: str = sys.executable) -> dict:
    """The torch ``python`` imports: ``version``, ``cuda`` (None for a CPU build), ``abi`` (its
    C++11 ABI flag), ``gpu`` (whether it sees one) and ``cp``, the interpreter's wheel tag."""
    out = subprocess.run([python, "-c", _TORCH_PROBE], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def cuda_home(version: str = "12.4") -> Path:
    """A relocatable CUDA_HOME with nvcc, headers (incl. CCCL) and cudart.

    Layout as in /usr/local/cuda: ``bin/`` (nvcc, ptxas, fatbinary, nvlink,
    cudafe++, cuobjdump for 12.4, nvcc.profile), ``nvvm/`` (cicc, libdevice),
    ``include/`` and ``lib64/`` (libcudart.so). See ``CudaRelease`` and
    ``CudaWheelRelease`` for where the pieces come from and why the versions are what they are.
    """
    release: CudaRelease | CudaWheelRelease | None = CUDA_RELEASES.get(version) or CUDA_WHEEL_RELEASES.get(version)
    if release is None:
        raise ValueError(
            f"no recipe for CUDA {version}; known: {', '.join(sorted({*CUDA_RELEASES, *CUDA_WHEEL_RELEASES}))}. "
            "The cu12 nvcc wheels on PyPI ship only ptxas and libnvvm, not nvcc itself."
        )
    dest = cache_dir() / f"cuda-{version}"
    spec = asdict(release)
    if _is_ready(dest, spec):
        return dest
    with _lock(dest):
        if _is_ready(dest, spec):
            return dest
        downloads = cache_dir() / "downloads" / f"cuda-{version}"
        downloads.mkdir(parents=True, exist_ok=True)
        if isinstance(release, CudaRelease):
            wheels = _download_cuda_wheels(release, downloads)
            deb: Path | None = _download_debian_toolkit(release, downloads)
        else:
            wheels, deb = _download_wheels(dict(release.wheels), release.version, downloads), None
        # Assemble next to dest and rename at the end, so dest is never half-built.
        partial = dest.with_name(dest.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        for wheel in wheels:
            _unpack_nvidia_wheel(wheel, partial)
        if deb is not None:
            _unpack_debian_tools(deb, partial)
        (partial / "bin" / "nvcc.profile").write_text(_NVCC_PROFILE if deb is not None else _NVCC13_PROFILE)
        # Linkers look for the unversioned name; the wheel ships only the soname.
        (partial / "lib64" / "libcudart.so").symlink_to(f"libcudart.so.{version.split('.')[0]}")
        _check_cuda_home(partial, release)
        _mark(partial, spec)
        shutil.rmtree(dest, ignore_errors=True)
        partial.rename(dest)
    return dest


def _download_cuda_wheels(release: CudaRelease, downloads: Path) -> list[Path]:
    pins = {
        "nvidia-cuda-nvcc-cu12": release.nvcc,
        "nvidia-cuda-runtime-cu12": release.runtime,
        "nvidia-cuda-cccl-cu12": release.cccl,
    }
    return _download_wheels(pins, release.version, downloads)


def _download_wheels(pins: Mapping[str, str], version: str, downloads: Path) -> list[Path]:
    _log(f"downloading CUDA {version} wheels into {downloads}")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            *_platform_args(),
            "--dest",
            str(downloads),
            *(f"{name}=={ver}" for name, ver in pins.items()),
        ],
        progress=True,
    )
    wheels = []
    for name, ver in pins.items():
        stem = f"{name.replace('-', '_')}-{ver}-"
        found = sorted(downloads.glob(f"{stem}*.whl"))
        if not found:
            raise RuntimeError(f"pip download left no {stem}*.whl in {downloads}")
        wheels.append(found[-1])
    return wheels


def _download_debian_toolkit(release: CudaRelease, downloads: Path) -> Path:
    """Fetch nvidia-cuda-toolkit with apt-get, using private apt state (no root needed)."""
    deb_version = release.debian_toolkit.replace(":", "%3a")
    deb = downloads / f"nvidia-cuda-toolkit_{deb_version}_amd64.deb"
    if deb.exists():
        return deb
    if shutil.which("dpkg-deb") is None:
        raise RuntimeError(
            "assembling CUDA needs dpkg-deb (for nvidia-cuda-toolkit, the only registry source of nvcc for CUDA 12)"
        )
    options = _private_apt(downloads / "apt", f"deb {{keyring}} {{mirror}} {release.debian_suite} non-free")
    _log(f"fetching nvidia-cuda-toolkit {release.debian_toolkit} from Debian {release.debian_suite}")
    _run(["apt-get", *options, "-qq", "update"], progress=True)
    _run(
        [
            "apt-get",
            *options,
            "-qq",
            "download",
            f"nvidia-cuda-toolkit={release.debian_toolkit}",
        ],
        cwd=downloads,
        progress=True,
    )
    if not deb.exists():
        raise RuntimeError(f"apt-get download did not produce {deb}")
    return deb


def _private_apt(apt_root: Path, source: str) -> list[str]:
    """apt-get options for a state of its own under ``apt_root`` that reads one sources line,
    ``source`` with ``{keyring}`` and ``{mirror}`` filled in: the machine's apt state is neither
    read nor written, and no root is needed."""
    keyring = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
    if shutil.which("apt-get") is None or not keyring.exists():
        raise RuntimeError("fetching from Debian's archive needs apt-get and Debian's archive keyring")
    (apt_root / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (apt_root / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    sources = apt_root / "sources.list"
    sources.write_text(source.format(keyring=f"[signed-by={keyring}]", mirror=_debian_mirror()) + "\n")
    options = [
        "-o",
        f"Dir::Etc::SourceList={sources}",
        "-o",
        "Dir::Etc::SourceParts=-",
        "-o",
        f"Dir::State={apt_root}",
        "-o",
        f"Dir::State::Lists={apt_root / 'lists'}",
        "-o",
        "Dir::State::status=/dev/null",
        "-o",
        f"Dir::Cache={apt_root / 'cache'}",
        "-o",
        "Debug::NoLocking=1",
    ]
    if os.geteuid() == 0:
        # The _apt sandbox user cannot write into a root-owned cache.
        options += ["-o", "APT::Sandbox::User=root"]
    return options


# --------------------------------------------------------------------------
# A second CPython


# The engine tier's images carry a second CPython beside Debian bookworm's 3.11 (tests/engine).
# No registry this suite reaches ships a CPython build to run on bookworm: Debian has no 3.12,
# and trixie's python3.13 binaries need a newer glibc than bookworm's. So 3.13 is compiled here
# from the upstream source in Debian's own source package (the .orig tarball, its hashes checked
# by apt against the signed archive), on this Debian 12 machine, for bookworm's glibc.
SECOND_PYTHON = "3.13"
_CPYTHON_SUITE = "trixie"
# What the images use (ssl, ctypes, venv, ensurepip and the compression modules pip and torch
# need); without -g, at -O1 and without the modules left out below, the compile takes about half
# the CPU time of the default (measured here: 3.2 against 6.1 CPU minutes).
_CPYTHON_CONFIGURE = (
    "--without-ensurepip",
    "--disable-test-modules",
    "OPT=-DNDEBUG -O1",
    *(
        f"py_cv_module_{name}=n/a"
        for name in ("_decimal", "_sqlite3", "_tkinter", "_curses", "_curses_panel", "_dbm", "_gdbm", "readline")
    ),
)
_CPYTHON_CHECK = "import bz2, ctypes, ensurepip, hashlib, lzma, ssl, venv, zlib"


def cpython(version: str = SECOND_PYTHON) -> Path:
    """CPython ``version`` built from Debian's source into a prefix of its own under the test
    cache: ``bin/pythonX.Y``, ``lib/pythonX.Y/``, ``include/pythonX.Y/``. Built once (about 2
    minutes on 2 cores); needs a C compiler, make and the -dev packages .ci/setup installs."""
    dest = cache_dir() / f"cpython-{version}"
    spec = {"python": version, "debian_suite": _CPYTHON_SUITE, "configure": list(_CPYTHON_CONFIGURE)}
    binary = dest / "bin" / f"python{version}"
    if _is_ready(dest, spec) and binary.is_file():
        return dest
    with _lock(dest):
        if _is_ready(dest, spec) and binary.is_file():
            return dest
        source = _debian_source(f"python{version}", _CPYTHON_SUITE, cache_dir() / "downloads" / f"cpython-{version}")
        # The prefix is compiled into the interpreter, so it is built in place; only the marker
        # says it is complete.
        shutil.rmtree(dest, ignore_errors=True)
        with tempfile.TemporaryDirectory(dir=cache_dir(), prefix=f".cpython-{version}-build-") as tmp:
            _log(f"building CPython from {source.name} into {dest}")
            with tarfile.open(source) as tar:
                tar.extractall(tmp, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
            (tree,) = Path(tmp).glob("Python-*/configure")
            # The interpreters the build runs read no PYTHONPATH or PYTHONHOME of the tests'.
            env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
            _run(["./configure", "-q", f"--prefix={dest}", *_CPYTHON_CONFIGURE], cwd=tree.parent, env=env)
            _run(["make", "-s", f"-j{os.cpu_count() or 1}"], cwd=tree.parent, env=env)
            _run(["make", "-s", "install"], cwd=tree.parent, env=env)
        try:
            _run([str(binary), "-c", _CPYTHON_CHECK])
        except RuntimeError as exc:
            raise RuntimeError(
                f"CPython {version} was built without a module the images need; its -dev package is "
                f"missing here (.ci/setup installs them): {exc}"
            ) from None
        _mark(dest, spec)
    return dest


def _debian_source(package: str, suite: str, downloads: Path) -> Path:
    """The upstream tarball (``*.orig.tar.*``) of Debian ``suite``'s source ``package``, fetched
    with apt-get into ``downloads`` once."""
    found = _upstream_tarballs(downloads, package)
    if len(found) == 1:
        return found[0]
    shutil.rmtree(downloads, ignore_errors=True)
    downloads.mkdir(parents=True)
    options = _private_apt(downloads / "apt", f"deb-src {{keyring}} {{mirror}} {suite} main")
    _log(f"fetching the source of {package} from Debian {suite}")
    _run(["apt-get", *options, "-qq", "update"], progress=True)
    _run(["apt-get", *options, "-qq", "source", "--download-only", f"{package}/{suite}"], cwd=downloads, progress=True)
    found = _upstream_tarballs(downloads, package)
    if len(found) != 1:
        raise RuntimeError(f"apt-get source left {len(found)} upstream tarballs of {package} in {downloads}")
    return found[0]


def _upstream_tarballs(downloads: Path, package: str) -> list[Path]:
    return sorted(p for p in downloads.glob(f"{package}_*.orig.tar.*") if p.suffix != ".asc")  # not its signature


# buildx from Debian 13: Debian 12 has no buildx, and trixie's 0.13 needs only libc6 >= 2.34.
BUILDX_SUITE = "trixie"


def buildx_config() -> Path:
    """A ``DOCKER_CONFIG`` directory whose ``cli-plugins/`` holds Debian 13's docker-buildx, for
    ``docker buildx bake`` with the 20.10 CLI of Debian 12. The system's apt state is untouched."""
    plugins = _debian_binary(
        "docker-buildx", "usr/libexec/docker/cli-plugins/docker-buildx", "buildx", "config/cli-plugins"
    )
    return plugins.parent  # DOCKER_CONFIG: the folder above cli-plugins/


def cosign() -> Path:
    """Debian 13's cosign (2.5, statically linked but for libc): the independent verifier of the
    signatures and attestations fa-images attaches to images (Debian 12 has none; its skopeo and
    podman are built with sigstore disabled)."""
    return _debian_binary("cosign", "usr/bin/cosign", "cosign", "bin") / "cosign"


def _debian_binary(package: str, member: str, name: str, into: str) -> Path:
    """The folder ``into`` (under the test cache's ``name``) holding the file ``member`` of Debian
    13's ``package``, fetched once with an apt state of its own (the system's is untouched)."""
    root = cache_dir() / name
    spec = {"package": package, "suite": BUILDX_SUITE}
    with _lock(root):
        if _is_ready(root, spec):
            return root / into
        shutil.rmtree(root, ignore_errors=True)
        downloads = root / "downloads"
        downloads.mkdir(parents=True)
        options = _private_apt(downloads / "apt", f"deb {{keyring}} {{mirror}} {BUILDX_SUITE} main")
        _log(f"fetching {package} from Debian {BUILDX_SUITE}")
        _run(["apt-get", *options, "-qq", "update"], progress=True)
        _run(["apt-get", *options, "-qq", "download", package], cwd=downloads, progress=True)
        (deb,) = downloads.glob(f"{package}_*.deb")
        _run(["dpkg-deb", "-x", str(deb), str(downloads / "tree")])
        (root / into).mkdir(parents=True)
        shutil.copy2(downloads / "tree" / member, root / into)
        shutil.rmtree(downloads)
        _mark(root, spec)
    return root / into


def _debian_mirror() -> str:
    """The Debian archive URI that this machine's apt sources already use."""
    apt = Path("/etc/apt")
    files = [apt / "sources.list", *sorted((apt / "sources.list.d").glob("*"))]
    for path in files:
        try:
            text = path.read_text()
        except OSError:
            continue
        if path.suffix == ".sources":  # deb822 stanzas
            for stanza in re.split(r"\n\s*\n", text):
                fields = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, re.MULTILINE))
                suites = fields.get("Suites", "").split()
                # The main archive, not -security/-updates (other URIs or layouts).
                if any("-" not in suite for suite in suites) and fields.get("URIs"):
                    return fields["URIs"].split()[0]
        else:
            for line in text.splitlines():
                match = re.match(r"deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+([\w]+)\s", line)
                if match:
                    return match.group(1)
    raise RuntimeError("no Debian archive found in /etc/apt sources")


def _unpack_nvidia_wheel(wheel: Path, root: Path) -> None:
    """Merge ``nvidia/<component>/{bin,include,lib,nvvm}`` of a wheel into root."""
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            parts = info.filename.split("/")
            if info.is_dir() or len(parts) < 4 or parts[0] != "nvidia":
                continue
            rel = parts[2:]
            if rel[0] not in ("bin", "include", "lib", "nvvm") or rel[-1] == "__init__.py":
                continue
            if rel[0] == "lib":
                if rel[1] == "cmake":
                    continue
                rel[0] = "lib64"
            target = root.joinpath(*rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            # zipfile drops permissions; the unix mode sits in the high bits.
            executable = (info.external_attr >> 16) & 0o100
            target.chmod(0o755 if executable else 0o644)


def _unpack_debian_tools(deb: Path, root: Path) -> None:
    with tempfile.TemporaryDirectory(dir=root.parent) as tmp:
        _run(["dpkg-deb", "-x", str(deb), tmp])
        for src, dst in _DEBIAN_TOOLS.items():
            target = root / dst
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(Path(tmp) / src, target)


def _check_cuda_home(root: Path, release: CudaRelease | CudaWheelRelease) -> None:
    """Fail early unless nvcc reports the release and can build and link a kernel."""
    nvcc = root / "bin" / "nvcc"
    out = _run([str(nvcc), "--version"], capture=True)
    match = re.search(r"release (\d+\.\d+), V(\S+)", out)
    if not match or match.group(1) != release.version or match.group(2) != release.nvcc:
        raise RuntimeError(f"{nvcc} does not report CUDA {release.nvcc}:\n{out}")
    # Compile with nvcc and link with the host compiler, as torch extensions
    # do; nvcc's own linking would also want libcudadevrt/libcudart_static,
    # which the wheels do not ship.
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "smoke.cu").write_text(_SMOKE_CU)
        _run(
            [
                str(nvcc),
                "-std=c++17",
                "-gencode",
                "arch=compute_80,code=sm_80",
                "-Xcompiler",
                "-fPIC",
                "-c",
                "smoke.cu",
                "-o",
                "smoke.o",
            ],
            cwd=tmp,
        )
        _run(
            [
                "c++",
                "-shared",
                "smoke.o",
                f"-L{root / 'lib64'}",
                "-lcudart",
                "-o",
                "smoke.so",
            ],
            cwd=tmp,
        )


def _cp_tag(python_version: str) -> str:
    if not re.fullmatch(r"3\.\d+", python_version):
        raise ValueError(f"expected a CPython version like '3.11', got {python_version!r}")
    return "cp" + python_version.replace(".", "")


def _platform_args() -> list[str]:
    return [arg for plat in MANYLINUX_PLATFORMS for arg in ("--platform", plat)]


def _offline_pip_env() -> dict[str, str]:
    """Environment for pip that sees only the given --find-links, not local config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _is_ready(path: Path, spec: Mapping[str, object]) -> bool:
    try:
        return json.loads((path / MARKER).read_text()) == json.loads(json.dumps(spec))
    except (OSError, ValueError):
        return False


def _mark(path: Path, spec: Mapping[str, object]) -> None:
    (path / MARKER).write_text(json.dumps(spec, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _log(message: str) -> None:
    """A step of the cache's making, with the time it starts: the run's log then says where its
    setup time went (bench/test_suite.md)."""
    print(f"[toolchain {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _run(
    cmd: Sequence[str],
    *,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    capture: bool = False,
    progress: bool = False,
) -> str:
    """Run cmd, raising RuntimeError with its output if it fails.

    progress=True streams output to our stderr (long downloads); otherwise it
    is kept and shown only on failure.
    """
    try:
        if progress:
            subprocess.run(cmd, cwd=cwd, env=env, check=True, stdout=_stderr_fd())
            return ""
        proc = subprocess.run(
            cmd,
            cwd=cwd,
            env=env,
            check=True,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
    except FileNotFoundError as exc:
        raise RuntimeError(f"cannot run {cmd[0]}: {exc}") from exc
    except subprocess.CalledProcessError as exc:
        output = f":\n{exc.stdout}" if exc.stdout else " (output above)"
        raise RuntimeError(f"command failed with exit code {exc.returncode}: {' '.join(cmd)}{output}") from exc
    return proc.stdout if capture else ""


def _stderr_fd() -> int:
    # Under pytest's capsys sys.stderr has no file descriptor; use fd 2.
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return 2

"""How the GPU check's container gets the host's GPUs (``fa-images build --gpus``).

``runtime`` (the default) asks the engine for every GPU through a device request, which the
NVIDIA Container Toolkit answers (the usual setup on AWS G5/G6 and most GPU hosts). An
engine without it has no ``nvidia`` runtime, and the check is skipped.

``devices`` needs no toolkit: the NVIDIA device nodes (``/dev/nvidia*``) are passed to the
container and the driver's user-space libraries (``libcuda.so*``, ``libnvidia-*.so*``, as
the host's loader finds them) are bind-mounted read-only into ``DRIVER_LIB_DIR``, which is
put first on the container's ``LD_LIBRARY_PATH``. That directory is where nvidia-docker 1
put the driver, and NVIDIA's CUDA images already search it.

``none`` skips the GPU check.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import FatalError

MODES = ("runtime", "devices", "none")
DEV = Path("/dev")
DRIVER_LIB_DIR = "/usr/local/nvidia/lib64"
# Where distributions and GPU hosts put the driver's libraries, after the loader's own cache.
LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/nvidia/lib64",
    "/usr/local/nvidia/lib",
)
_LIBRARY = re.compile(r"^(libcuda|libcudadebugger|libnvidia-[\w.-]+)\.so(\.\d+)*$")


class NoHostGpus(FatalError):
    """``--gpus devices`` on a host without NVIDIA device nodes or driver libraries."""

    exit_code = 3


@dataclass(frozen=True)
class HostGpus:
    """The host's NVIDIA device nodes and driver libraries, as passed to a container."""

    devices: tuple[str, ...]
    libraries: tuple[str, ...]  # host paths; links are kept by name and mounted as their target

    def describe(self) -> str:
        gpus = sum(1 for d in self.devices if re.fullmatch(r"nvidia\d+", Path(d).name))
        return f"{gpus} GPU(s) through {len(self.devices)} device nodes and {len(self.libraries)} driver libraries"


@dataclass(frozen=True)
class GpuAccess:
    """The resolved ``--gpus`` choice: a mode, and for ``devices`` what was found."""

    mode: str = "runtime"
    host: HostGpus | None = field(default=None)


def _is_char_device(path: Path) -> bool:
    try:
        return stat.S_ISCHR(path.stat().st_mode)
    except OSError:
        return False


def find_devices(dev: Path | None = None) -> tuple[str, ...]:
    """NVIDIA device nodes: /dev/nvidia<N>, the control nodes, and /dev/nvidia-caps/* (MIG)."""
    dev = dev or DEV
    found = [p for p in dev.glob("nvidia*") if _is_char_device(p)]
    caps = dev / "nvidia-caps"
    if caps.is_dir():
        found += [p for p in caps.iterdir() if _is_char_device(p)]
    return tuple(sorted(str(p) for p in found))


def _loader_dirs() -> list[str]:
    """Directories in which the host's loader cache finds libcuda."""
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [os.path.dirname(line.rsplit("=>", 1)[1].strip()) for line in out.splitlines() if "libcuda.so" in line]


def find_libraries(dirs: Iterable[str] | None = None) -> tuple[str, ...]:
    """The driver's user-space libraries in the first directory that holds libcuda.so.1."""
    for directory in dirs if dirs is not None else [*_loader_dirs(), *LIBRARY_DIRS]:
        folder = Path(directory)
        if not (folder / "libcuda.so.1").exists():
            continue
        return tuple(sorted(str(p) for p in folder.iterdir() if _LIBRARY.match(p.name) and p.exists()))
    return ()


def discover(dev: Path | None = None, library_dirs: Iterable[str] | None = None) -> HostGpus:
    """What ``--gpus devices`` passes; one clear error when the host has no NVIDIA GPU or driver."""
    dev = dev or DEV
    devices = find_devices(dev)
    if f"{dev}/nvidiactl" not in devices or not any(re.fullmatch(r"nvidia\d+", Path(d).name) for d in devices):
        raise NoHostGpus(
            f"--gpus devices: no NVIDIA device nodes in {dev} (need {dev}/nvidiactl and {dev}/nvidia0 or another "
            f"{dev}/nvidia<N>; found {', '.join(devices) or 'none'}); load the NVIDIA driver, "
            "or use --gpus runtime (NVIDIA Container Toolkit) or --gpus none"
        )
    searched = list(library_dirs) if library_dirs is not None else [*_loader_dirs(), *LIBRARY_DIRS]
    libraries = find_libraries(searched)
    if not libraries:
        raise NoHostGpus(
            f"--gpus devices: no NVIDIA driver library libcuda.so.1 in {', '.join(dict.fromkeys(searched))}; "
            "install the NVIDIA driver's user-space libraries, or use --gpus none"
        )
    return HostGpus(devices=devices, libraries=libraries)


def resolve(mode: str) -> GpuAccess:
    """``--gpus MODE`` -> what the GPU check will use; ``devices`` looks at the host now, before any build."""
    return GpuAccess(mode, discover() if mode == "devices" else None)


def container_options(host: HostGpus, image_env: list[str] | None) -> dict:
    """``containers.create`` keyword arguments that give a container the host's GPUs, toolkit-free."""
    from docker.types import Mount

    env = dict(item.split("=", 1) for item in image_env or [] if "=" in item)
    library_path = ":".join(p for p in (DRIVER_LIB_DIR, env.get("LD_LIBRARY_PATH", "")) if p)
    return {
        "devices": [f"{d}:{d}:rwm" for d in host.devices],
        # A link is mounted as the file it points to, under the link's own name (libcuda.so.1).
        "mounts": [
            Mount(f"{DRIVER_LIB_DIR}/{Path(lib).name}", os.path.realpath(lib), type="bind", read_only=True)
            for lib in host.libraries
        ],
        "environment": {"LD_LIBRARY_PATH": library_path},
    }

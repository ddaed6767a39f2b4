"""Reads the truth about the build machine: torch, nvcc, CPUs and usable memory.

Nothing here trusts a guess. The C++ ABI comes from the torch that is installed (torch
2.6.0 ships both ABIs depending on the CUDA variant; every pip torch >= 2.7 is new-ABI),
and the memory budget comes from the cgroup limit, because inside a container
``/proc/meminfo`` and psutil report the host's RAM.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .contract import cuda_tag
from .errors import EnvironmentProblem
from .wording import counted

GIB = 1024**3
# nvcc peaks at 3-5 GB per thread on flash-attn's kernels; size for the worst case.
BYTES_PER_NVCC_THREAD = 5 * GIB
MAX_NVCC_THREADS = 4  # one per gencode target; flash-attn builds name at most four archs


@dataclass(frozen=True)
class TorchInfo:
    version: str
    cuda: str | None  # None for a CPU build of torch
    cxx11_abi: bool
    python: str  # "3.12"
    site_packages: str = ""  # the directory that holds torch; its path differs per Python

    @property
    def public(self) -> str:
        """'2.13.0' of '2.13.0+cpu': the release, without its local label."""
        return self.version.split("+")[0]

    @property
    def major_minor(self) -> str:
        return ".".join(self.public.split(".")[:2])


TORCH_INDEX = "https://download.pytorch.org/whl"


def cuda_torch_command(version: str, tag: str) -> str:
    """How to install the CUDA build ``tag`` ('cu128') of torch ``version`` from torch's own index."""
    return f"pip install torch=={version} --index-url {TORCH_INDEX}/{tag}"


@dataclass(frozen=True)
class NvccInfo:
    path: Path
    version: str  # "12.8"

    @property
    def cuda_home(self) -> Path:
        return self.path.parent.parent


_TORCH_PROBE = (
    "import json, os, sys, torch; print(json.dumps({'version': torch.__version__, "
    "'cuda': torch.version.cuda, 'cxx11_abi': bool(torch._C._GLIBCXX_USE_CXX11_ABI), "
    "'python': '%d.%d' % sys.version_info[:2], "
    "'site_packages': os.path.dirname(os.path.dirname(torch.__file__))}))"
)


def probe_torch(python: str = sys.executable) -> TorchInfo:
    """Asks ``python`` about its torch, in a child process so nothing heavy loads here."""
    hint = (
        f"install the torch the wheel is for: {cuda_torch_command('X.Y.Z', 'cuXYZ')} "
        "(`fa-images doctor` names the CUDA builds of each torch)"
    )
    try:
        proc = subprocess.run([python, "-c", _TORCH_PROBE], capture_output=True, text=True, errors="replace")
    except OSError as exc:
        raise EnvironmentProblem(f"cannot run {python}: {exc.strerror}", hint=hint) from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise EnvironmentProblem(f"cannot import torch with {python}: {last}", hint=hint)
    info = _torch_info(proc.stdout.strip().splitlines()[-1:])
    if info is None:  # an import that exits 0 without a word, or a torch with no version
        raise EnvironmentProblem(f"{python} imported torch but could not say which one it is", hint=hint)
    return info


def _torch_info(lines: list[str]) -> TorchInfo | None:
    """The probe's answer, if it is one: every field of the type it must have."""
    try:
        data = json.loads(lines[0]) if lines and len(lines[0]) < 65536 else None
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    strings = ("version", "python", "site_packages")
    if not all(isinstance(data.get(k), str) and data[k] for k in strings) or not isinstance(
        data.get("cxx11_abi"), bool
    ):
        return None
    if data.get("cuda") is not None and not isinstance(data["cuda"], str):
        return None
    return TorchInfo(
        version=data["version"],
        cuda=data.get("cuda"),
        cxx11_abi=data["cxx11_abi"],
        python=data["python"],
        site_packages=data["site_packages"],
    )


def find_nvcc() -> Path | None:
    """nvcc as torch's cpp_extension finds it: $CUDA_HOME first, then PATH, then /usr/local/cuda."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home:
            candidate = Path(home) / "bin" / "nvcc"
            return candidate if candidate.exists() else None
    on_path = shutil.which("nvcc")
    if on_path:
        return Path(on_path)
    default = Path("/usr/local/cuda/bin/nvcc")
    return default if default.exists() else None


def probe_nvcc() -> NvccInfo:
    nvcc = find_nvcc()
    if nvcc is None:
        raise EnvironmentProblem(
            "no nvcc found (looked at $CUDA_HOME/bin, PATH and /usr/local/cuda/bin)",
            hint="install the CUDA toolkit that matches torch.version.cuda and set CUDA_HOME",
        )
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, errors="replace").stdout
    except OSError as exc:
        raise EnvironmentProblem(f"{nvcc} does not run: {exc.strerror}") from None
    match = re.search(r"release (\d+\.\d+)", out)
    if not match:
        raise EnvironmentProblem(f"{nvcc} --version printed no CUDA release: {out.strip()!r}")
    return NvccInfo(path=nvcc, version=match.group(1))


def check_toolchain(torch: TorchInfo, nvcc: NvccInfo) -> None:
    """A CUDA torch and an nvcc of the same major version, or one clear error."""
    if torch.cuda is None:
        # The CUDA build of this very torch, for the CUDA of the nvcc here: the two must agree.
        raise EnvironmentProblem(
            f"torch {torch.version} is a CPU build; building flash-attn needs a CUDA build of torch",
            hint=f"{cuda_torch_command(torch.public, cuda_tag(nvcc.version))} (the CUDA build of this torch "
            f"for the CUDA {nvcc.version} of {nvcc.path}; `fa-images doctor` names its other CUDA builds)",
        )
    if torch.cuda.split(".")[0] != nvcc.version.split(".")[0]:
        raise EnvironmentProblem(
            f"nvcc {nvcc.version} at {nvcc.path} does not match torch {torch.version}, "
            f"which was built with CUDA {torch.cuda}",
            hint=f"point CUDA_HOME at a CUDA {torch.cuda.split('.')[0]}.x toolkit",
        )


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().split()[0]
    except (OSError, IndexError):
        return None
    return int(text) if text.isdigit() else None


_ROOT_PAIRS = (
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # cgroup v2
    ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
)
_V2_BASES = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")  # unified: a hybrid v1/v2 host


def _own_cgroups(controller: str) -> list[str]:
    """This process's cgroup directories for ``controller`` and each of their parents, deepest first.

    A container sees its own cgroup as the root; a batch job does not: Slurm's task/cgroup puts
    each job in a cgroup below the root with no namespace of its own, so the root's files say
    nothing about the job's allocation (``/proc/self/cgroup`` names where it is).
    """
    try:
        text = Path("/proc/self/cgroup").read_text()
    except OSError:
        return []
    dirs: list[str] = []
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _id, controllers, path = fields
        if controllers == "":
            bases = list(_V2_BASES)
        elif controller in controllers.split(","):
            bases = [f"/sys/fs/cgroup/{controller}"]
        else:
            continue
        parts = [p for p in path.split("/") if p and p not in (".", "..")]
        dirs += [f"{base}/{'/'.join(parts[:depth])}" for depth in range(len(parts), 0, -1) for base in bases]
    return dirs


def _memory_pairs() -> list[tuple[str, str]]:
    """(limit file, usage file) of every cgroup whose limit applies to this process."""
    pairs = list(_ROOT_PAIRS)
    for directory in _own_cgroups("memory"):
        pairs.append((f"{directory}/memory.max", f"{directory}/memory.current"))
        pairs.append((f"{directory}/memory.limit_in_bytes", f"{directory}/memory.usage_in_bytes"))
    return pairs


def available_memory() -> int:
    """Bytes this process may still use: MemAvailable, capped by every cgroup's headroom above it."""
    meminfo = Path("/proc/meminfo").read_text() if Path("/proc/meminfo").exists() else ""
    match = re.search(r"MemAvailable:\s+(\d+) kB", meminfo)
    available = int(match.group(1)) * 1024 if match else 16 * GIB
    for limit_file, usage_file in _memory_pairs():
        limit = _read_int(Path(limit_file))
        if limit is not None and limit < 1 << 60:  # v1 reports "no limit" as a huge number
            usage = _read_int(Path(usage_file)) or 0
            available = min(available, max(limit - usage, 0))
    return available


def available_cpus() -> int:
    """CPUs this process may use: affinity (a batch job's cpuset), capped by a cgroup v2 CPU quota."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    for directory in ["/sys/fs/cgroup", *_own_cgroups("cpu")]:
        try:
            quota, period = Path(f"{directory}/cpu.max").read_text().split()
            if quota != "max":
                cpus = min(cpus, max(1, int(quota) // int(period)))
        except (OSError, ValueError):
            pass
    return cpus


@dataclass(frozen=True)
class Parallelism:
    max_jobs: int
    nvcc_threads: int
    reason: str


def size_parallelism(
    *,
    targets: int = 1,
    max_jobs: int | None = None,
    nvcc_threads: int | None = None,
    memory: int | None = None,
    cpus: int | None = None,
) -> Parallelism:
    """MAX_JOBS and NVCC_THREADS that fit the CPUs and the memory: an OOM-killed build wastes an hour.

    ``targets`` is the number of ``-gencode`` targets per kernel (archs, plus PTX). nvcc's
    ``--threads`` only runs those targets in parallel, so a one-arch build gets one thread
    per job; more threads than that would sit idle while holding their memory.
    """
    memory = available_memory() if memory is None else memory
    cpus = available_cpus() if cpus is None else cpus
    fit = memory // BYTES_PER_NVCC_THREAD
    threads = nvcc_threads or max(1, min(targets, MAX_NVCC_THREADS, cpus, fit))
    by_cpus = max(1, cpus // threads)  # never more compiler threads than CPUs
    by_memory = max(1, memory // (threads * BYTES_PER_NVCC_THREAD))
    jobs = max_jobs or min(by_cpus, by_memory)
    why_threads = "given" if nvcc_threads else f"{counted(targets, 'gencode target')} per kernel"
    why_jobs = f"min({cpus} CPUs / {threads}, {memory / GIB:.0f} GiB / ({threads} x 5 GiB))"
    reason = f"{jobs} jobs x {threads} nvcc threads ({why_threads}); " + ("MAX_JOBS given" if max_jobs else why_jobs)
    return Parallelism(max_jobs=jobs, nvcc_threads=threads, reason=reason)


def job_request(*, cpus: int, targets: int = 1) -> tuple[Parallelism, int]:
    """What a batch job of ``cpus`` CPUs needs for the build ``size_parallelism`` would run in it:
    that sizing, and the memory to ask for (jobs x nvcc threads x BYTES_PER_NVCC_THREAD)."""
    par = size_parallelism(targets=targets, cpus=cpus, memory=cpus * MAX_NVCC_THREADS * BYTES_PER_NVCC_THREAD)
    return par, par.max_jobs * par.nvcc_threads * BYTES_PER_NVCC_THREAD

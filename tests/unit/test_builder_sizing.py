"""Parallelism sized from real limits, the local version label, and arch parsing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from packaging.version import Version

from fa_images.builder import environment
from fa_images.builder.environment import GIB, size_parallelism
from fa_images.builder.generations.fa2 import LABEL
from fa_images.builder.settings import local_version_label, parse_archs

# --- size_parallelism --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("memory_gib", "cpus", "targets", "jobs", "threads"),
    [
        (24, 2, 1, 2, 1),  # one arch: one thread per nvcc, one job per CPU
        (8, 16, 1, 1, 1),  # 8 GiB holds one 5 GiB compile
        (125, 16, 1, 16, 1),  # the GPU machine, one arch: every CPU busy (was 12 x 2, 1.44x the floor)
        (503, 64, 1, 64, 1),  # 4xH200: 64 x 1, not 56 x 2 threads on 64 CPUs
        (125, 16, 2, 8, 2),  # two archs: two threads per nvcc, jobs x threads = CPUs
        (125, 16, 4, 4, 4),  # four archs (setup.py's default list)
        (30, 16, 4, 1, 4),  # memory is the limit: 30 // (4 x 5)
        (125, 4, 1, 4, 1),  # CPUs are the limit
        (1, 64, 1, 1, 1),  # never below one job
        (10, 8, 2, 1, 2),  # exactly 2 x 5 GiB keeps 2 threads
        (9.99, 8, 2, 1, 1),  # below it, one thread
    ],
)
def test_size_parallelism_fits_memory_and_cpus(
    memory_gib: float, cpus: int, targets: int, jobs: int, threads: int
) -> None:
    par = size_parallelism(targets=targets, memory=int(memory_gib * GIB), cpus=cpus)
    assert (par.max_jobs, par.nvcc_threads) == (jobs, threads)
    # Whatever it picks must fit: jobs x threads x 5 GiB within memory (unless at the 1x1 floor),
    # and never more compiler threads than CPUs.
    if (par.max_jobs, par.nvcc_threads) != (1, 1):
        assert par.max_jobs * par.nvcc_threads * environment.BYTES_PER_NVCC_THREAD <= memory_gib * GIB
    assert par.max_jobs * par.nvcc_threads <= max(cpus, par.nvcc_threads)
    assert f"{cpus} CPUs" in par.reason and f"{jobs} jobs x {threads} nvcc threads" in par.reason


def test_given_max_jobs_wins() -> None:
    par = size_parallelism(max_jobs=7, memory=8 * GIB, cpus=2)
    assert par.max_jobs == 7
    assert par.reason.endswith("MAX_JOBS given")


def test_given_nvcc_threads_are_kept_and_jobs_shrink_to_fit() -> None:
    par = size_parallelism(nvcc_threads=4, memory=45 * GIB, cpus=16)
    assert (par.max_jobs, par.nvcc_threads) == (2, 4)  # 45 // (4 x 5)
    small = size_parallelism(nvcc_threads=4, memory=8 * GIB, cpus=16)
    assert (small.max_jobs, small.nvcc_threads) == (1, 4)  # an explicit choice is not overridden


def test_size_parallelism_reads_this_machine() -> None:
    par = size_parallelism()
    cpus = len(os.sched_getaffinity(0))
    assert 1 <= par.max_jobs <= cpus
    assert par.nvcc_threads == 1  # one target by default


# --- available_memory / available_cpus against a fake /proc and /sys ---------------------


@pytest.fixture
def fake_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """environment's absolute paths (/proc/meminfo, /sys/fs/cgroup/...) resolve under tmp_path."""
    real_path = Path

    def rooted(path: str | Path) -> Path:
        text = str(path)
        return real_path(tmp_path / text.lstrip("/")) if text.startswith("/") else real_path(text)

    monkeypatch.setattr(environment, "Path", rooted)
    return tmp_path


def write(root: Path, path: str, text: str) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


MEMINFO_64G = "MemTotal:       98765432 kB\nMemFree:         1000000 kB\nMemAvailable:   67108864 kB\n"


def test_available_memory_without_a_cgroup_limit_is_memavailable(fake_root: Path) -> None:
    write(fake_root, "/proc/meminfo", MEMINFO_64G)
    assert environment.available_memory() == 64 * GIB


def test_available_memory_without_meminfo_assumes_16_gib_within_the_cgroup(fake_root: Path) -> None:
    assert environment.available_memory() == 16 * GIB
    write(fake_root, "/sys/fs/cgroup/memory.max", f"{6 * GIB}\n")
    assert environment.available_memory() == 6 * GIB  # no memory.current: nothing used yet


def test_available_memory_is_capped_by_the_cgroup_v2_headroom(fake_root: Path) -> None:
    write(fake_root, "/proc/meminfo", MEMINFO_64G)
    write(fake_root, "/sys/fs/cgroup/memory.max", f"{8 * GIB}\n")
    write(fake_root, "/sys/fs/cgroup/memory.current", f"{2 * GIB}\n")
    assert environment.available_memory() == 6 * GIB


def test_cgroup_v2_without_a_limit(fake_root: Path) -> None:
    write(fake_root, "/proc/meminfo", MEMINFO_64G)
    write(fake_root, "/sys/fs/cgroup/memory.max", "max\n")
    write(fake_root, "/sys/fs/cgroup/memory.current", f"{2 * GIB}\n")
    assert environment.available_memory() == 64 * GIB


def test_available_memory_is_capped_by_the_cgroup_v1_headroom(fake_root: Path) -> None:
    write(fake_root, "/proc/meminfo", MEMINFO_64G)
    write(fake_root, "/sys/fs/cgroup/memory/memory.limit_in_bytes", f"{4 * GIB}\n")
    write(fake_root, "/sys/fs/cgroup/memory/memory.usage_in_bytes", f"{1 * GIB}\n")
    assert environment.available_memory() == 3 * GIB


def test_cgroup_v1_unlimited_is_a_huge_number(fake_root: Path) -> None:
    write(fake_root, "/proc/meminfo", MEMINFO_64G)
    write(fake_root, "/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n")
    write(fake_root, "/sys/fs/cgroup/memory/memory.usage_in_bytes", f"{1 * GIB}\n")
    assert environment.available_memory() == 64 * GIB


def test_a_cgroup_over_its_limit_has_no_headroom(fake_root: Path) -> None:
    write(fake_root, "/proc/meminfo", MEMINFO_64G)
    write(fake_root, "/sys/fs/cgroup/memory.max", f"{4 * GIB}\n")
    write(fake_root, "/sys/fs/cgroup/memory.current", f"{5 * GIB}\n")
    assert environment.available_memory() == 0
    assert size_parallelism(memory=environment.available_memory(), cpus=8).max_jobs == 1


def test_a_cgroup_limit_below_memavailable_sizes_the_build(fake_root: Path) -> None:
    """The container case: the host has plenty, the cgroup allows 12 GiB."""
    write(fake_root, "/proc/meminfo", MEMINFO_64G)
    write(fake_root, "/sys/fs/cgroup/memory.max", f"{12 * GIB}\n")
    write(fake_root, "/sys/fs/cgroup/memory.current", "0\n")
    write(fake_root, "/sys/fs/cgroup/cpu.max", "max 100000\n")
    par = size_parallelism(cpus=16)
    assert (par.max_jobs, par.nvcc_threads) == (2, 1)  # 12 GiB // 5 GiB, not the host's 64


@pytest.mark.parametrize(("cpu_max", "expected"), [("200000 100000\n", 2), ("50000 100000\n", 1), ("max 100000\n", 8)])
def test_available_cpus_honours_the_cgroup_quota(
    fake_root: Path, monkeypatch: pytest.MonkeyPatch, cpu_max: str, expected: int
) -> None:
    monkeypatch.setattr(environment.os, "sched_getaffinity", lambda _pid: set(range(8)))
    write(fake_root, "/sys/fs/cgroup/cpu.max", cpu_max)
    assert environment.available_cpus() == expected


# --- local_version_label -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("cuda", "torch", "abi", "label"),
    [
        ("12.8", "2.9.1+cu128", True, "cu128torch2.9cxx11abitrue"),
        ("12.4", "2.6.0", False, "cu124torch2.6cxx11abifalse"),
        ("13.0", "2.10.0+cu130", True, "cu130torch2.10cxx11abitrue"),
        (None, "2.13.0+cpu", True, "cputorch2.13cxx11abitrue"),
    ],
)
def test_local_version_label(cuda: str | None, torch: str, abi: bool, label: str) -> None:
    assert local_version_label(cuda=cuda, torch=torch, cxx11_abi=abi) == label
    # It goes into the wheel's version, so it must be a PEP 440 local version as is.
    assert Version(f"2.8.3+{label}").local == label


@pytest.mark.parametrize("abi", [True, False])
def test_the_verifier_reads_the_label_back(abi: bool) -> None:
    label = local_version_label(cuda="12.8", torch="2.9.1+cu128", cxx11_abi=abi)
    match = LABEL.search(label)
    assert match is not None
    assert (match["cuda"], match["torch"], match["abi"].lower() == "true") == ("128", "2.9", abi)


# --- parse_archs -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "archs"),
    [
        ("80", ("80",)),
        ("80,90", ("80", "90")),
        ("90,80", ("80", "90")),
        ("8.0;9.0", ("80", "90")),
        ("sm_80", ("80",)),
        ("SM_90, sm_120 ,100", ("90", "100", "120")),
        ("80,80,8.0", ("80",)),
        ("80,", ("80",)),
        ("110", ("110",)),
    ],
)
def test_parse_archs(text: str, archs: tuple[str, ...]) -> None:
    assert parse_archs(text) == archs


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("86", "'86' is not a flash-attn arch"),
        ("8.9", "'8.9' is not a flash-attn arch"),
        ("75", "'75'"),
        ("sm_90a", "'sm_90a'"),
        ("compute_80", "'compute_80'"),
        ("eighty", "'eighty'"),
        ("", "no archs given"),
        (" , ;", "no archs given"),
    ],
)
def test_parse_archs_refuses(text: str, needle: str) -> None:
    with pytest.raises(ValueError) as exc:
        parse_archs(text)
    assert needle in str(exc.value)
    if "not a flash-attn arch" in str(exc.value):
        assert "8.6 and 8.9 GPUs run the 80 kernels" in str(exc.value)


def test_a_batch_job_s_own_cgroup_limit_sizes_the_build(fake_root: Path) -> None:
    """Slurm's task/cgroup: the job's cgroup is below the root, named in /proc/self/cgroup."""
    write(fake_root, "/proc/meminfo", MEMINFO_64G)
    job = "/system.slice/slurmstepd.scope/job_7/step_batch"
    write(fake_root, "/proc/self/cgroup", f"0::{job}\n")
    write(fake_root, f"/sys/fs/cgroup{job}/memory.max", "max\n")
    write(fake_root, "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_7/memory.max", f"{10 * GIB}\n")
    write(fake_root, "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_7/memory.current", f"{GIB}\n")
    assert environment.available_memory() == 9 * GIB  # the job's limit, from a parent of the step


def test_a_cgroup_v1_job_limit_counts_too(fake_root: Path) -> None:
    write(fake_root, "/proc/meminfo", MEMINFO_64G)
    write(fake_root, "/proc/self/cgroup", "4:memory:/slurm/uid_0/job_3/step_0\n0::/\n")
    write(fake_root, "/sys/fs/cgroup/memory/slurm/uid_0/job_3/memory.limit_in_bytes", f"{5 * GIB}\n")
    assert environment.available_memory() == 5 * GIB

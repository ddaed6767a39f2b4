"""Whether each build job of an exported workflow fits its runner and its timeout.

Each generation estimates its compile from what was measured of it (``Recipe.work``, in
config/generations/): flash-attn 2's measured kernel costs times the gencode targets, the units
another's setup.py compiles for the entry's knobs, a grid of calls compiled one after another.

nvcc's work is spread over the jobs the builder runs on the runner (the sizing it applies there:
one nvcc job per CPU, 5 GiB each). A job that would run out of time is refused at export, with
what fits, not found out after six hours on a runner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...builder import environment
from ...builder.wording import counted
from ...config.generations import Work
from ...config.model import Entry
from ...errors import UsageError

# GitHub's ubuntu-latest runner for a public repository: 4 CPUs, 16 GiB.
HOSTED_CPUS, HOSTED_MEMORY_GIB = 4, 16
OTHER_MINUTES = 20  # a build job besides the compile: setup, the torch stage, the image, checks, uploads


@dataclass(frozen=True)
class Fit:
    entry: str
    minutes: int  # the job, compile and the rest
    jobs: int  # nvcc jobs at once on the runner


def work(entry: Entry) -> Work:
    """What the entry's build job compiles, as its generation estimates it."""
    return entry.recipe.work(entry)


def compile_core_minutes(entry: Entry) -> float:
    """Core-minutes of the entry's nvcc compile, all its kernels and targets."""
    return work(entry).nvcc_core_seconds / 60


def fit(entry: Entry, *, cpus: int, memory_gib: int, shards: int = 1) -> Fit:
    """The longest job the entry makes (its build job, or one of its shards) on such a runner."""
    job = work(entry)
    shards = shards if job.shardable else 1
    par = environment.size_parallelism(targets=job.targets, cpus=cpus, memory=memory_gib * environment.GIB)
    busy = par.max_jobs * min(par.nvcc_threads, job.targets)  # cores compiling at once
    minutes = job.nvcc_core_seconds / 60 / shards / busy + job.serial_seconds / 60 + OTHER_MINUTES
    return Fit(entry=entry.id, minutes=math.ceil(minutes), jobs=par.max_jobs)


def check(entries: tuple[Entry, ...], *, cpus: int, memory_gib: int, timeout: int, shards: int, sharding: bool) -> None:
    """Refuses an export whose longest build job would pass ``timeout`` minutes on its runner."""
    fits = [fit(e, cpus=cpus, memory_gib=memory_gib, shards=shards) for e in entries]
    over = [f for f in fits if f.minutes > timeout]
    if not over:
        return
    worst = max(over, key=lambda f: f.minutes)
    entry = next(e for e in entries if e.id == worst.entry)
    job = work(entry)
    shards = shards if job.shardable else 1
    left = max(1, timeout - OTHER_MINUTES - math.ceil(job.serial_seconds / 60))
    needed = math.ceil(job.nvcc_core_seconds / 60 / shards / left)
    ways = []
    if job.nvcc_core_seconds:
        ways.append(f"a runner of {needed} CPUs and {needed * 5} GiB (--runs-on, --runner-cpus, --runner-memory)")
        if sharding and job.shardable:
            ways.append(f"--shards {math.ceil(job.nvcc_core_seconds / 60 / left / worst.jobs)}")
    ways += ["fewer archs per entry (an image per GPU class)", "a longer --timeout-minutes"]
    raise UsageError(
        f"{counted(len(over), 'build job')} would run out of time (--timeout-minutes {timeout}) on a runner of "
        f"{cpus} CPUs and {memory_gib} GiB: {worst.entry} {job.what}, about {worst.minutes} min with "
        f"{counted(worst.jobs, 'nvcc job')} at once",
        hint="; or ".join(ways),
    )

"""Whether each build job of an exported workflow fits its runner and its timeout.

flash-attn 2's compile is measured (builder/compile_costs.json: the compile seconds of each of
its kernels for one arch, on one core each), so a job's compile is those seconds times the
gencode targets, spread over the jobs the builder runs on the runner (the sizing it applies
there: one nvcc job per CPU, 5 GiB each). A job that would pass its timeout is refused at
export, with what fits, not found out after six hours on a runner. FlashAttention-3 and -4 are
not in the measured table, and are not estimated.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass

from ...builder import environment, setup_shim
from ...builder.wording import counted
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


@functools.cache
def _arch_core_seconds() -> float:
    """The measured compile seconds of all of flash-attn's kernels, for one arch: read once."""
    return float(sum(json.loads(setup_shim.COSTS_FILE.read_text())["kernels"].values()))


def compile_core_minutes(entry: Entry) -> float | None:
    """Core-minutes of the entry's kernels, all archs (and PTX); None where none is measured."""
    if entry.fa3 is not None or entry.fa4 is not None:
        return None
    return _arch_core_seconds() * (len(entry.archs) + int(entry.ptx)) / 60


def fit(entry: Entry, *, cpus: int, memory_gib: int, shards: int = 1) -> Fit | None:
    """The longest job the entry makes (its build job, or one of its shards) on such a runner."""
    core_minutes = compile_core_minutes(entry)
    if core_minutes is None:
        return None
    targets = len(entry.archs) + int(entry.ptx)
    par = environment.size_parallelism(targets=targets, cpus=cpus, memory=memory_gib * environment.GIB)
    busy = par.max_jobs * min(par.nvcc_threads, targets)  # cores compiling at once
    minutes = core_minutes / shards / busy + OTHER_MINUTES
    return Fit(entry=entry.id, minutes=math.ceil(minutes), jobs=par.max_jobs)


def check(entries: tuple[Entry, ...], *, cpus: int, memory_gib: int, timeout: int, shards: int, sharding: bool) -> None:
    """Refuses an export whose longest build job would pass ``timeout`` minutes on its runner."""
    fits = [f for e in entries if (f := fit(e, cpus=cpus, memory_gib=memory_gib, shards=shards))]
    over = [f for f in fits if f.minutes > timeout]
    if not over:
        return
    worst = max(over, key=lambda f: f.minutes)
    entry = next(e for e in entries if e.id == worst.entry)
    core_minutes = compile_core_minutes(entry) or 0
    needed = math.ceil(core_minutes / shards / max(1, timeout - OTHER_MINUTES))
    ways = [f"a runner of {needed} CPUs and {needed * 5} GiB (--runs-on, --runner-cpus, --runner-memory)"]
    if sharding:
        ways.append(f"--shards {math.ceil(core_minutes / max(1, timeout - OTHER_MINUTES) / worst.jobs)}")
    ways += ["fewer archs per entry (an image per GPU class)", "a longer --timeout-minutes"]
    raise UsageError(
        f"{counted(len(over), 'build job')} would run out of time (--timeout-minutes {timeout}) on a runner of "
        f"{cpus} CPUs and {memory_gib} GiB: {worst.entry} compiles {len(entry.archs) + int(entry.ptx)} arch(s) of "
        f"flash-attn's kernels, about {worst.minutes} min with {counted(worst.jobs, 'nvcc job')} at once",
        hint="; or ".join(ways),
    )

"""Per-step compile times from a build's .ninja_log, and how close the build came to its floor.

    python bench/ninja_costs.py NINJA_LOG CPUS [--write-costs FILE]

ninja writes one line per step: start and end in ms since the build began, mtime, output.
The floor of a build on CPUS cores is max(longest step, sum of steps / CPUS): no schedule
can beat it. Prints the summary and the slowest steps, to refresh
fa_images/builder/compile_costs.json from measurements.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

KINDS = ("flash_fwd_split_", "flash_bwd_", "flash_fwd_", "flash_api")  # most specific first


def cost_model(steps: list[tuple[float, float, str]], source: str) -> dict:
    """compile_costs.json: each kernel's measured seconds, each kind's median, the overall median."""
    seconds = {Path(name).stem: round(end - start) for start, end, name in steps}
    kinds = []
    for kind in KINDS:
        matching = [
            s for stem, s in seconds.items() if kind in stem and not any(k in stem for k in KINDS[: KINDS.index(kind)])
        ]
        if matching:
            kinds.append({"contains": kind, "seconds": round(statistics.median(matching))})
    return {
        "about": f"Compile seconds of flash-attn's sources, to start the longest first. Measured: {source}. "
        "Only the order matters. Refresh with bench/ninja_costs.py NINJA_LOG CPUS --write-costs FILE.",
        "default": round(statistics.median(seconds.values())),
        "kinds": kinds,
        "kernels": dict(sorted(seconds.items())),
    }


def read_steps(log: Path) -> list[tuple[float, float, str]]:
    steps = []
    for line in log.read_text().splitlines():
        if line.startswith("#"):
            continue
        start, end, _mtime, output, *_ = line.split("\t")
        steps.append((int(start) / 1000, int(end) / 1000, Path(output).name))
    return steps


def floor(durations: list[float], cpus: int) -> float:
    """max(longest step, sum of steps / cpus): no schedule of these steps on ``cpus`` beats it."""
    return max(max(durations, default=0.0), sum(durations) / cpus)


def simulate(durations: list[float], cpus: int) -> float:
    """Wall time of starting ``durations`` in this order on ``cpus`` workers (ninja's list scheduling)."""
    free = [0.0] * cpus
    for d in durations:
        free.sort()
        free[0] += d
    return max(free)


def main(log: Path, cpus: int) -> None:
    steps = read_steps(log)
    durations = [end - start for start, end, _ in steps]
    wall = max(end for _, end, _ in steps) - min(start for start, _, _ in steps)
    bound = floor(durations, cpus)
    print(f"steps {len(steps)}  sum {sum(durations):.0f} s  median {statistics.median(durations):.0f} s")
    print(f"longest {max(durations):.0f} s  wall {wall:.0f} s  floor max(longest, sum/{cpus}) {bound:.0f} s")
    print(f"wall / floor = {wall / bound:.2f}")
    as_run = simulate([end - start for start, end, _ in sorted(steps)], cpus)
    longest = simulate(sorted(durations, reverse=True), cpus)
    print(f"simulated from these step times: order as run {as_run:.0f} s ({as_run / bound:.2f}x floor), ")
    print(f"  longest first {longest:.0f} s ({longest / bound:.2f}x floor)")
    print("slowest steps (start s, seconds, output):")
    for start, end, name in sorted(steps, key=lambda s: s[0] - s[1])[:12]:
        print(f"  {start:7.0f} {end - start:6.0f}  {name}")
    kinds: dict[str, list[float]] = {}
    for (_start, _end, name), d in zip(steps, durations):
        kind = re.sub(r"_hdim\d+.*", "", name.removesuffix(".o"))
        kinds.setdefault(kind, []).append(d)
    for kind, seconds in sorted(kinds.items()):
        print(f"  {kind}: median {statistics.median(seconds):.0f} s, max {max(seconds):.0f} s (n={len(seconds)})")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
    if "--write-costs" in sys.argv:
        target = Path(sys.argv[sys.argv.index("--write-costs") + 1])
        about = "flash-attn 2.8.3, sm_90, 16 jobs x 1 nvcc thread, 16-core H100 machine (bench/gpu_build.md)"
        data = cost_model(read_steps(Path(sys.argv[1])), about)
        target.write_text(json.dumps(data, indent=1) + "\n")

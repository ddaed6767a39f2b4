"""Per-step compile times from a build's .ninja_log, and how close the build came to its floor.

    python bench/ninja_costs.py NINJA_LOG CPUS

ninja writes one line per step: start and end in ms since the build began, mtime, output.
The floor of a build on CPUS cores is max(longest step, sum of steps / CPUS): no schedule
can beat it. Prints the summary and the slowest steps, to refresh
fa_images/builder/compile_costs.json from measurements.
"""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path


def main(log: Path, cpus: int) -> None:
    steps = []
    for line in log.read_text().splitlines():
        if line.startswith("#"):
            continue
        start, end, _mtime, output, *_ = line.split("\t")
        steps.append((int(start) / 1000, int(end) / 1000, Path(output).name))
    durations = [end - start for start, end, _ in steps]
    wall = max(end for _, end, _ in steps) - min(start for start, _, _ in steps)
    floor = max(max(durations), sum(durations) / cpus)
    print(f"steps {len(steps)}  sum {sum(durations):.0f} s  median {statistics.median(durations):.0f} s")
    print(f"longest {max(durations):.0f} s  wall {wall:.0f} s  floor max(longest, sum/{cpus}) {floor:.0f} s")
    print(f"wall / floor = {wall / floor:.2f}")
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

"""P6: the wall time of one cold compile sharded over N machines, simulated over a measured ninja log.

    python bench/sharded_compile.py NINJA_LOG CPUS LINK_SECONDS [N ...]

We have one GPU machine, so the N machines are simulated: each shard gets the kernels that
`wheel --shard I/N` gives it (fa_images.builder.shards.partition over compile_costs.json, the
builder's own code), and runs them longest first on CPUS workers, with the step times of the
log (ninja's list scheduling, as bench/ninja_costs.py simulates one machine). The final run
(`wheel --after-shards`) takes every kernel from the cache; its cost is LINK_SECONDS, a measured
warm run. A shard's own start-up (unpacking the sdist, probing torch) is left out.

Printed per N: the slowest shard, the wall (slowest shard + link), the bound of N machines
max(longest step, sum / (N x CPUS)), and wall / (bound + link). The same with the cost model
reduced to its per-kind medians shows how much a cost model that knows less would lose.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ninja_costs import floor, read_steps, simulate

from fa_images.builder import setup_shim
from fa_images.builder.shards import partition


def shard_walls(seconds: dict[str, float], count: int, cpus: int, cost: Callable[[str], float]) -> list[float]:
    subsets = partition(sorted(seconds), count, cost)
    return [simulate(sorted((seconds[k] for k in subset), reverse=True), cpus) for subset in subsets]


def main(log: Path, cpus: int, link: float, counts: list[int]) -> None:
    steps = read_steps(log)
    seconds = {Path(name).stem: end - start for start, end, name in steps if not name.startswith("flash_api")}
    costs = json.loads(setup_shim.COSTS_FILE.read_text())
    kinds_only = {**costs, "kernels": {}}
    total, longest = sum(seconds.values()), max(seconds.values())
    print(f"{log.name}: {len(seconds)} kernels, sum {total:.0f} s, longest {longest:.0f} s; {cpus} CPUs per machine")
    print(f"link run (every kernel from the cache, flash_api.cpp, link, verify): {link:.0f} s, measured")
    print(
        "| machines | slowest shard (s) | wall = shard + link (s) | bound / N (s) | wall / (bound + link) "
        "| slowest shard, kind medians only (s) |"
    )
    print("|---|---|---|---|---|---|")
    for count in counts:
        walls = shard_walls(seconds, count, cpus, lambda s: setup_shim.expected_seconds(s, costs))
        coarse = shard_walls(seconds, count, cpus, lambda s: setup_shim.expected_seconds(s, kinds_only))
        bound = floor(list(seconds.values()), count * cpus)
        wall = max(walls) + link
        ratio = wall / (bound + link)
        print(f"| {count} | {max(walls):.0f} | {wall:.0f} | {bound:.0f} | {ratio:.2f} | {max(coarse):.0f} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), [int(n) for n in sys.argv[4:]] or [1, 2, 3, 4, 6, 8])

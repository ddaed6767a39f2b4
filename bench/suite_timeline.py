"""Where each worker of a suite's run spent its time, test module by test module.

As a pytest plugin, it records every test phase the run reports (its worker, start and stop):

    FA_IMAGES_TIMELINE=timeline.jsonl python -m pytest -p bench.suite_timeline

As a script, it reads that record back: each worker's modules in the order they ran, when each
began and ended (seconds from the run's first test), the seconds its phases took, and the time the
worker stood idle at the end while the other still ran:

    python bench/suite_timeline.py timeline.jsonl
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

VARIABLE = "FA_IMAGES_TIMELINE"
# A record's fields and their types, as the plugin writes them.
FIELDS: dict[str, type | tuple[type, ...]] = {
    "worker": str,
    "id": str,
    "when": str,
    "start": (int, float),
    "stop": (int, float),
}
# A whole run of the suite records 6,291 phases in 1.9 MB (runs 47 and 48).
MAX_BYTES = 64 << 20


def pytest_runtest_logreport(report: Any) -> None:
    path = os.environ.get(VARIABLE)
    if not path or os.environ.get("PYTEST_XDIST_WORKER"):  # the controller writes, as reports reach it
        return
    node = getattr(report, "node", None)  # pytest-xdist's worker the report came from
    worker = node.gateway.id if node is not None else "main"
    record = {"worker": worker, "id": report.nodeid, "when": report.when, "start": report.start, "stop": report.stop}
    with open(path, "a") as out:
        out.write(json.dumps(record) + "\n")


def summary(lines: list[dict[str, Any]]) -> str:
    zero = min(r["start"] for r in lines)
    end = max(r["stop"] for r in lines)
    modules: dict[str, dict[str, list[float]]] = defaultdict(dict)  # worker -> module -> [start, stop, busy]
    for r in lines:
        span = modules[r["worker"]].setdefault(r["id"].split("::")[0], [r["start"], r["stop"], 0.0])
        span[0], span[1] = min(span[0], r["start"]), max(span[1], r["stop"])
        span[2] += r["stop"] - r["start"]
    out = [f"run: {end - zero:.0f} s from the first test to the last"]
    for worker in sorted(modules):
        spans = sorted(modules[worker].items(), key=lambda item: item[1][0])
        last = max(stop for _, (_, stop, _) in spans)
        out.append(f"\n{worker}: busy until {last - zero:.0f} s, idle for the last {end - last:.0f} s")
        out.extend(
            f"  {start - zero:6.0f} {stop - zero:6.0f} {busy:7.1f}  {module}"
            for module, (start, stop, busy) in spans
            if busy >= 1
        )
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        lines = read(Path(argv[0]))
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # json's errors are ValueErrors
        print(f"error: {argv[0]}: not a timeline this plugin wrote ({exc})", file=sys.stderr)
        return 2
    print(summary(lines))
    return 0


def bounded_text(path: Path) -> str:
    """The text of a record a bench script wrote; a ValueError where it is not a regular file of at
    most MAX_BYTES (a FIFO, a device or a directory)."""
    if not path.is_file() or path.stat().st_size > MAX_BYTES:
        raise ValueError(f"not a regular file of at most {MAX_BYTES >> 20} MiB")
    return path.read_text()


def read(path: Path) -> list[dict[str, Any]]:
    """Every record of a timeline the plugin wrote; a ValueError or OSError where it is not one."""
    lines = [_record(json.loads(line)) for line in bounded_text(path).splitlines() if line.strip()]
    if not lines:
        raise ValueError("no test phase in it")
    return lines


def _record(value: Any) -> dict[str, Any]:
    """One line as the plugin writes it, or a ValueError that says what is wrong with it."""
    if not isinstance(value, dict) or any(not isinstance(value.get(k), t) for k, t in FIELDS.items()):
        raise ValueError(f"a line is not a record of {', '.join(FIELDS)}: {str(value)[:80]}")
    return value


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

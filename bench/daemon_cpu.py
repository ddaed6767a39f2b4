"""The CPU of the engines' daemons while the suite runs, test by test.

The accounting of finished processes counts a daemon once, when it exits, so it cannot say which
test made the shared engine work. This sampler reads each daemon's CPU every few seconds:

    python -m bench.daemon_cpu sample LOG [SECONDS]

It appends one JSON line per sample to LOG: the time, and the user + system seconds of every
process named in DAEMONS, by pid. Stop it with SIGTERM (`pkill -f daemon_cpu.py`). Read back
against a timeline of the same run (bench/suite_timeline.py), it prints each daemon's total, and
the CPU each one used during every test phase of one worker that made it work for more than
SECONDS (default 4):

    python -m bench.daemon_cpu report LOG TIMELINE [WORKER] [SECONDS]
"""

from __future__ import annotations

import bisect
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from bench import suite_timeline

DAEMONS = frozenset({"dockerd", "containerd", "buildkitd", "podman", "docker-registry"})
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_of_daemons() -> dict[str, tuple[str, float]]:
    """pid -> (name, user + system seconds) of every running daemon of DAEMONS."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:  # it exited meanwhile
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        if name in DAEMONS:
            fields = stat[stat.rindex(")") + 2 :].split()
            found[pid] = (name, (int(fields[11]) + int(fields[12])) / TICKS)
    return found


def sample(log: Path, every: float) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with log.open("a") as out:
        while True:
            out.write(json.dumps({"t": time.time(), "p": cpu_of_daemons()}) + "\n")
            out.flush()
            time.sleep(every)


class Daemon:
    """One daemon's CPU over the run: its readings, and the last one it had before each sample."""

    def __init__(self, pid: str, name: str, samples: list[dict[str, Any]]) -> None:
        self.pid, self.name = pid, name
        self.times = [s["t"] for s in samples]
        self.cpu: list[float] = []
        last = 0.0
        for s in samples:
            last = s["p"].get(pid, (name, last))[1]
            self.cpu.append(last)
        self.first = next(s["t"] for s in samples if pid in s["p"])

    def at(self, when: float) -> float:
        """Its CPU as the last sample at or before ``when`` read it."""
        return self.cpu[max(bisect.bisect_right(self.times, when) - 1, 0)]


def report(log: Path, timeline: Path, worker: str, least: float) -> str:
    samples = [json.loads(line) for line in suite_timeline.bounded_text(log).splitlines() if line.strip()]
    names = {pid: name for s in samples for pid, (name, _) in s["p"].items()}
    daemons = sorted((Daemon(pid, name, samples) for pid, name in names.items()), key=lambda d: d.first)
    daemons = [d for d in daemons if d.cpu[-1] >= least]
    phases = suite_timeline.read(timeline)
    zero = min(p["start"] for p in phases)
    out = ["each daemon: pid, name, when it was first seen (seconds from the first test), CPU seconds"]
    out += [f"  {d.pid:>7} {d.name:16} {round(d.first - zero):7d} {d.cpu[-1]:8.1f}" for d in daemons]
    out.append(f"\n{worker}'s phases that made a daemon work for {least:g} CPU s or more (start, length, CPU by pid):")
    for p in sorted((p for p in phases if p["worker"] == worker), key=lambda p: p["start"]):
        used = {d.pid: d.at(p["stop"]) - d.at(p["start"]) for d in daemons}
        if max(used.values(), default=0) >= least:
            spent = " ".join(f"{pid}:{cpu:.0f}" for pid, cpu in used.items() if cpu >= 1)
            out.append(f"  {p['start'] - zero:6.0f} {p['stop'] - p['start']:6.0f}  {spent}  {p['when']} {p['id']}")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    try:
        if len(argv) in (2, 3) and argv[0] == "sample":
            sample(Path(argv[1]), float(argv[2]) if len(argv) == 3 else 5.0)
            return 0
        if 3 <= len(argv) <= 5 and argv[0] == "report":
            worker = argv[3] if len(argv) > 3 else "gw0"
            print(report(Path(argv[1]), Path(argv[2]), worker, float(argv[4]) if len(argv) > 4 else 4.0))
            return 0
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:  # json's errors are ValueErrors
        print(f"error: {' '.join(argv[:3])}: {exc!r}", file=sys.stderr)
        return 2
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

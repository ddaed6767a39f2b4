"""Samples the disk the test suite uses while it runs, and prints the peak.

    python bench/disk_sampler.py LOG [SECONDS]

Every SECONDS (default 15) it appends one line to LOG: the size of the test cache's engine
data, of the rest of the test cache, and of the temp dir (registries, build contexts, pytest's
directories), read with `du`; and `fs`, what the whole filesystem under the test cache has lost
since the sampler began (statvfs), which also counts what no named tree holds: an engine's
scratch files in /var/tmp, packages installed beside the run. The peak is the largest `fs`.
Stop it with Ctrl-C or SIGTERM (`pkill -f disk_sampler`); it then prints the largest sample.
Started in the background of a script, where SIGINT is ignored, it still stops on either: a
sampler left running is a `du` of the whole tree every few seconds beside the run it measures.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CACHE = Path(os.environ.get("FA_IMAGES_TEST_CACHE") or Path.home() / ".cache" / "fa-images-tests")


def megabytes(groups: dict[str, list[Path]]) -> dict[str, int]:
    """Each group's size from one `du` over every path: a file hard-linked into two places (a
    test links the cache's wheels into the index it serves from the temp dir) counts once, in the
    first group that holds it, as it does on the disk."""
    group_of = {str(path): name for name, paths in groups.items() for path in paths}
    out = subprocess.run(["du", "-sxm", *group_of], capture_output=True, text=True).stdout
    sizes = dict.fromkeys(groups, 0)
    for line in out.splitlines():  # "SIZE<tab>PATH"; a path gone meanwhile has no line
        size, _, path = line.partition("\t")
        sizes[group_of[path]] += int(size)
    return sizes


def used_megabytes(path: Path) -> int:
    """What the filesystem holding ``path`` has in use, as `df` counts it."""
    stat = os.statvfs(path)
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize // (1 << 20)


def _stop(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    log, every = Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 15.0
    for signum in (signal.SIGINT, signal.SIGTERM):  # a background job starts with SIGINT ignored
        signal.signal(signum, _stop)
    peak: tuple[int, str] | None = None  # fs is below zero where the run freed what was there before
    anchor = next(p for p in (CACHE, *CACHE.parents) if p.exists())
    start = used_megabytes(anchor)
    try:
        while True:
            engines = [CACHE / "docker", CACHE / "podman"]
            rest = [p for p in (CACHE.iterdir() if CACHE.is_dir() else []) if p not in engines]
            sizes = megabytes({"engines": engines, "cache": rest, "tmp": [Path(tempfile.gettempdir())]})
            total, fs = sum(sizes.values()), used_megabytes(anchor) - start
            line = " ".join(
                [time.strftime("%T"), *(f"{k}={v}M" for k, v in sizes.items()), f"total={total}M", f"fs={fs}M"]
            )
            with log.open("a") as out:
                out.write(line + "\n")
            peak = max(peak or (fs, line), (fs, line))
            time.sleep(every)
    except KeyboardInterrupt:
        print(f"peak: {peak[1] if peak else 'no sample taken'}")


if __name__ == "__main__":
    main()

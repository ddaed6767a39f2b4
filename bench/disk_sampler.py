"""Samples the disk the test suite uses while it runs, and prints the peak.

    python bench/disk_sampler.py LOG [SECONDS]

Every SECONDS (default 15) it appends one line to LOG: the size of the test cache's engine
data, of the rest of the test cache, and of the temp dir (registries, build contexts, pytest's
directories), read with `du`. Stop it with Ctrl-C; it then prints the largest sample.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CACHE = Path(os.environ.get("FA_IMAGES_TEST_CACHE") or Path.home() / ".cache" / "fa-images-tests")


def megabytes(path: Path, *exclude: str) -> int:
    args = ["du", "-sxm", *(f"--exclude={e}" for e in exclude), str(path)]
    out = subprocess.run(args, capture_output=True, text=True).stdout.split()
    return int(out[0]) if out else 0


def main() -> None:
    log, every = Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 15.0
    peak = (0, "")
    try:
        while True:
            engine = megabytes(CACHE / "docker") + megabytes(CACHE / "podman")
            rest = megabytes(CACHE, "docker", "podman")
            tmp = megabytes(Path(tempfile.gettempdir()))
            line = f"{time.strftime('%T')} engines={engine}M cache={rest}M tmp={tmp}M total={engine + rest + tmp}M"
            with log.open("a") as out:
                out.write(line + "\n")
            peak = max(peak, (engine + rest + tmp, line))
            time.sleep(every)
    except KeyboardInterrupt:
        print(f"peak: {peak[1]}")


if __name__ == "__main__":
    main()

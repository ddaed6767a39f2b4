"""The unit tier's shared fixtures."""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from fa_images import cli
from fa_images.builder import environment
from fa_images.run import buildkit

_PROBE_TORCH = environment.probe_torch  # the real one: the fixture below stands in for it


@pytest.fixture(scope="session")
def _probe_torch_once(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], environment.TorchInfo]:
    """The torch probe, once per interpreter; this one's once for all the run's workers (its answer
    kept in the run's temp dir, under a lock), since each would import torch in a child for it."""
    run_dir = tmp_path_factory.getbasetemp().parent if os.environ.get("PYTEST_XDIST_WORKER") else None

    @functools.cache
    def probe(python: str) -> environment.TorchInfo:
        if run_dir is None or python != sys.executable:
            return _PROBE_TORCH(python)
        answer = run_dir / "torch-probe.json"
        with open(run_dir / "torch-probe.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if answer.is_file():
                return environment.TorchInfo(**json.loads(answer.read_text()))
            info = _PROBE_TORCH(python)
            answer.write_text(json.dumps(dataclasses.asdict(info)))
            return info

    return probe


@pytest.fixture(autouse=True)
def _own_cache_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's ~/.cache (sdists, compiler caches) is never read or written by a unit test."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache-home")))


@pytest.fixture(autouse=True)
def _torch_probed_once_per_python(
    monkeypatch: pytest.MonkeyPatch, _probe_torch_once: Callable[[str], environment.TorchInfo]
) -> None:
    """The real torch probe imports torch in a child (~1.5 s); its answer for one interpreter
    cannot change within a run, so the unit tier asks each interpreter once."""
    monkeypatch.setattr(environment, "probe_torch", lambda python=sys.executable: _probe_torch_once(python))


# The docker CLI the unit tier says the host has: one with buildx, as most users' have. No unit test
# asks the host's own CLI (it has buildx, or not, or is absent); a test of another host says so.
STUB_CLI = buildkit.Cli(("docker", "buildx", "build"), {}, "`docker buildx build` (the unit tier's stub)", loads=True)


# The same for a command run as a child: the first `docker` on its PATH answers `buildx version`
# and nothing else (a unit test that reached an engine through it would fail loudly).
STUB_DOCKER = r"""#!/bin/sh
[ "$1" = buildx ] && [ "$2" = version ] && echo "github.com/docker/buildx v0.20.0 (the unit tier's stub)" && exit 0
echo "the unit tier's docker stub answers \`docker buildx version\` only, not: docker $*" >&2
exit 64
"""


@pytest.fixture(scope="session")
def _stub_docker_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    where = tmp_path_factory.mktemp("docker-stub")
    (where / "docker").write_text(STUB_DOCKER)
    (where / "docker").chmod(0o755)
    return str(where)


@pytest.fixture(autouse=True)
def _no_probe_of_the_hosts_docker_cli(monkeypatch: pytest.MonkeyPatch, _stub_docker_dir: str) -> None:
    monkeypatch.setattr(buildkit, "find_cli", lambda docker=None: STUB_CLI)
    monkeypatch.setenv("PATH", f"{_stub_docker_dir}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.fixture
def run_fa_images(
    run_fa_images: Callable[..., subprocess.CompletedProcess[str]],
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``fa-images ARGS`` as the tiers above run it, but in this process: the same ``main``, the
    same exit code and the same two streams, without a Python start and its imports (134.6 to 122.4
    CPU seconds for the tier, bench/test_suite.md). A run given any other option (interpreter,
    module, environment, timeout) is the parent fixture's child process; the builder and engine
    tiers always run the real console script."""

    def run(args: Sequence[object], *, cwd: Path | None = None, **options: Any) -> subprocess.CompletedProcess[str]:
        argv = [str(a) for a in args]
        if options:
            return run_fa_images(argv, cwd=cwd, **options)
        capfd.readouterr()  # what the test printed before is not the command's
        with monkeypatch.context() as scope:
            if cwd is not None:
                scope.chdir(cwd)
            try:
                code = cli.main(argv)
            except SystemExit as exit_:  # argparse's usage errors and --help
                code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        out, err = capfd.readouterr()
        return subprocess.CompletedProcess([sys.executable, "-m", "fa_images", *argv], code, out, err)

    return run

"""Session fixtures shared by the builder tests: toolchain, real sdists, the CLI."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Callable, Generator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import toolchain
import xdist_schedule
from xdist.remote import Producer
from xdist.scheduler import LoadGroupScheduling

from fa_images.config.matrix import Matrix
from fa_images.config.matrix import load as load_matrix

REPO_ROOT = Path(__file__).resolve().parents[1]

# sha256 of the real flash-attn sdists as PyPI publishes them. obtain_sdist also checks
# the index's own hash on the first download; pinning them here re-checks the cached
# copies on every run, so a corrupt cache cannot make the tests pass or fail by accident.
REAL_SDISTS = {
    "2.6.3": "5bfae9500ad8e7d2937ebccb4906f3bc464d1bf66eedd0e4adabd520811c7b52",
    "2.7.4.post1": "f03485c9a49a4d68d0733acdcad80ab0e72afa025a777fdc2966ceccf9d51765",
    "2.8.3": "1e71dd64a9e0280e0447b8a0c2541bad4bf6ac65bdeaa2f90e51a9e57de0370d",
}


# The engine tier shares one Docker Engine for the whole run (tests/engine/conftest.py), so its
# modules are one group for pytest-xdist: one worker, in order. A module that names a group of its
# own (Podman, its own engine) keeps it. Every other module is a group of its own, so its module
# fixtures (a compile, a venv) are made once, on one worker.
ENGINE_TIER = "engine"
TIERS = (ENGINE_TIER, "unit", "builder")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups off the items
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            engine = item.path.parent.name == ENGINE_TIER
            item.add_marker(
                pytest.mark.xdist_group(xdist_schedule.ENGINE_GROUP if engine else item.nodeid.split("::")[0])
            )
    # The groups in this order (`--no-loadscope-reorder`): the engine tier first on one worker,
    # then the other engine groups, one after another, on the other. A worker is handed its next
    # group when two or fewer of its tests are left, the engine group's worker when it has none
    # (tests/xdist_schedule.py).
    items.sort(key=_rank)


def _skips_fail() -> bool:
    """Under CI (``CI=true``, as CI runs ``.ci/run``) a skip is a failure: the machine CI runs on
    has every prerequisite `.ci/setup` installs, so a test that skips there tested nothing."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def _fail_the_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"skipped under CI=true, where nothing may skip: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    if _skips_fail():
        _fail_the_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, None]:
    outcome = yield  # a module that skips itself as it is collected
    if _skips_fail():
        _fail_the_skip(outcome.get_result())


# The modules each tier starts with.
# - The unit tier's longest (mypy over the package; actionlint and shellcheck over every workflow
#   the export writes): a worker that takes one last would run alone at the end.
# - The builder tier's Python 3.9 stage, which holds about 4 GB for its four minutes: right after
#   the unit tier it meets the second Python's torch stage (37-39 GB of the disk with it, runs 56-58
#   of bench/test_suite.md), not the torch release loop's push (39.3 GB, run 55).
# - Then the Slurm export, the tier's longest after it (two to four minutes): last in name order,
#   it was the queue's last group and ran alone at the end (runs 64 and 66).
FIRST_IN_TIER = {
    "unit": ("test_project.py", "test_exports.py"),
    "builder": ("test_python39_builder_stage.py", "test_slurm_export.py"),
}


# The engine groups beside the shared engine's story, in this order. Podman's commit of its torch
# stage holds about 18 GB for a minute; first, it meets the first build before that build's push
# and second Python. Bake's two engines hold about 9 GB, which fits beside them.
OWN_ENGINES_FIRST = ("podman", "bake")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> LoadGroupScheduling | None:
    """The suite's scheduler where it runs by group (pytest.ini_options); pytest-xdist's own otherwise."""
    return xdist_schedule.EngineGroupAlone(config, log) if config.getoption("dist") == "loadgroup" else None


def _rank(item: pytest.Item) -> tuple[int, int, int, int]:
    tier = item.path.parent.name
    group = item.get_closest_marker("xdist_group")
    name = group.args[0] if group is not None else None
    own = OWN_ENGINES_FIRST.index(name) if name in OWN_ENGINES_FIRST else len(OWN_ENGINES_FIRST)
    first = item.path.name in FIRST_IN_TIER.get(tier, ())
    tier_rank = TIERS.index(tier) if tier in TIERS else len(TIERS)
    return (tier_rank, 0 if name == xdist_schedule.ENGINE_GROUP else 1, own, 0 if first else 1)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def cuda_home() -> Path:
    """CUDA 12.4 toolkit assembled from registries (see tests/toolchain.py)."""
    return toolchain.cuda_home()


@pytest.fixture(scope="session")
def cuda13_home() -> Path:
    """CUDA 13.0 toolkit made of NVIDIA's wheels alone (see tests/toolchain.py)."""
    return toolchain.cuda_home("13.0")


@pytest.fixture(scope="session")
def toolchain_venv() -> Path:
    """Venv with torch 2.9.1+cu128 and the build helpers."""
    return toolchain.torch_venv()


@pytest.fixture(scope="session")
def venv_python(toolchain_venv: Path) -> str:
    return str(toolchain_venv / "bin" / "python")


@pytest.fixture(scope="session")
def system_torch() -> dict:
    """The torch of the interpreter that runs the tests and the CLI (see toolchain.torch_facts)."""
    return toolchain.torch_facts()


@pytest.fixture(scope="session")
def venv_torch(venv_python: str) -> dict:
    """The toolchain venv's torch, which must be the one it was made with."""
    info = toolchain.torch_facts(venv_python)
    assert info["version"].startswith(toolchain.TORCH_VERSION + "+cu128"), info
    return info


@pytest.fixture(scope="session")
def sdist_cache() -> Path:
    return toolchain.cache_dir() / "sdists"


@pytest.fixture(scope="session")
def real_sdist(sdist_cache: Path) -> Callable[[str], Path]:
    """real_sdist("2.8.3") -> the real flash-attn sdist, downloaded once and cached."""
    from fa_images.builder.source import obtain_sdist

    def get(version: str) -> Path:
        path, _sha = obtain_sdist(
            version=version,
            sdist=None,
            dest_dir=sdist_cache,
            sources_dir=sdist_cache,
            sha256=REAL_SDISTS[version],
        )
        return path

    return get


@pytest.fixture(scope="session")
def run_fa_images() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Runs ``python -m fa_images ARGS`` the way a user would, with this checkout importable."""

    def run(
        args: Sequence[str],
        *,
        python: str = sys.executable,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        module: str = "fa_images",
        timeout: float = 900,
    ) -> subprocess.CompletedProcess[str]:
        full_env = {**os.environ, **(env or {})}
        full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), (env or {}).get("PYTHONPATH")]))
        return subprocess.run(
            [python, "-m", module, *map(str, args)],
            capture_output=True,
            text=True,
            env=full_env,
            cwd=cwd,
            timeout=timeout,
        )

    return run


@pytest.fixture(scope="session")
def prepare_only() -> Callable[..., list[str | Path]]:
    """The arguments of ``fa-images wheel ... --prepare-only`` (fetch, unpack and settle the
    settings, no compile): the source is ``sdist=`` a file or ``flash_attn=`` a version, the
    positional ``options`` go in as they are."""

    def args(
        *options: str | Path,
        out: str | Path,
        sdist: Path | None = None,
        flash_attn: str | None = None,
        work: str | Path | None = None,
        keep_work: bool = False,
        json: bool = False,
    ) -> list[str | Path]:
        assert (sdist is None) != (flash_attn is None), "one source: sdist= or flash_attn="
        source = ["--sdist", sdist] if sdist is not None else ["--flash-attn", flash_attn]
        return [
            "wheel",
            *source,
            *options,
            "--out",
            out,
            *(["--work-dir", work] if work is not None else []),
            *(["--keep-work"] if keep_work else []),
            "--prepare-only",
            *(["--json"] if json else []),
        ]

    return args


@pytest.fixture(scope="session")
def pinned_sdist() -> Callable[[Path], None]:
    """pinned_sdist(root) writes a local 2.8.3 sdist and a compat.yaml pinning it: executor and exports run offline."""

    def write(root: Path) -> None:
        sdists = root / "sdists"
        sdists.mkdir(exist_ok=True)
        (sdists / "flash_attn-2.8.3.tar.gz").write_bytes(b"sdist")
        sha = hashlib.sha256(b"sdist").hexdigest()
        (root / "compat.yaml").write_text(f'flash_attn:\n  "2.8.3": {{sha256: {sha}, cuda_archs_env: true}}\n')

    return write


@pytest.fixture
def tiny_matrix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pinned_sdist: Callable[[Path], None]) -> Matrix:
    """A two-entry matrix whose sdist is a local file: the executor's tests run offline."""
    pinned_sdist(tmp_path)
    (tmp_path / "matrix.yaml").write_text(
        "image: reg.local/fa\ncompat: compat.yaml\npackages: {sdists: sdists}\n"
        'matrix:\n  python: ["3.11", "3.12"]\n  torch: ["2.9.1"]\n  flash_attn: ["2.8.3"]\n  archs: [[80]]\n'
    )
    monkeypatch.chdir(tmp_path)
    return load_matrix(tmp_path / "matrix.yaml")


@pytest.fixture
def site_server(tmp_path: Path):
    """One HTTP server for a Pages-like site (/site/) and a release's downloads (/release/), with
    the paths every request asked for."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    requested: list[str] = []

    class Handler(SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            requested.append(self.path)

    root = tmp_path / "web"
    (root / "release").mkdir(parents=True)
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}/", requested
    finally:
        server.shutdown()
        server.server_close()

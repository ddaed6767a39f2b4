"""What the engine tests share for the whole run: one Docker Engine, one base image, and one
package index, so that the torch stage every entry stands on is built once and its layers are
reused by every module, as they are for a user's entries of the same base, Python and torch.
The base is devel and runtime alike, so each compile runs on that torch stage itself, with no
copy of its 7 GB venv; only the second Python's build has a runtime base of its own
(engine_env.Stock).

The index serves the torch wheelhouse (torch 2.9.1 with its CUDA libraries, the build tools,
flash-attn's runtime dependencies) for Python 3.11 and the second Python, 3.13 (compiled once
from Debian's source: tests/toolchain.py), which the base carries beside Debian's 3.11.
Every module's matrix takes torch from it by the same URL, so the torch stage's RUN line, and
with it the layer cache's key, is the same everywhere. One registry, which wants a login, takes
the pushes of the whole run. The engine's test images are removed when the run ends. Podman's
module, an engine of its own on the other pytest-xdist worker, is served by an index of its own there.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import build_project
import engine_env
import pytest
import toolchain

# The hygiene tests watch the engine start and stop with its users: they run before any
# module takes the shared engine, which holds it to the end of the run. The check of what the
# tier left on it runs after every other module.
FIRST = "test_engine_hygiene.py"
LAST = "test_engine_left_clean.py"
SECOND_PYTHON = toolchain.SECOND_PYTHON
SECOND_CP = "cp" + SECOND_PYTHON.replace(".", "")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    engine = [item for item in items if item.path.parent.name == "engine"]
    if not engine:
        return
    first = [item for item in engine if item.path.name == FIRST]
    last = [item for item in engine if item.path.name == LAST]
    middle = [item for item in engine if item not in first and item not in last]
    start = items.index(engine[0])
    rest = [item for item in items[start:] if item not in engine]
    items[:] = items[:start] + first + middle + last + rest


def _index_dir() -> Path:
    """One directory of hard links: the cp311 wheelhouse, and the second Python's own wheels beside it
    (one version of every pure wheel, so both Pythons resolve alike). A directory of its own for
    each worker of each run, so that nothing else on the machine empties the one it serves."""
    root = Path(tempfile.mkdtemp(prefix=engine_env.run_prefix(engine_env.INDEX_DIR_PREFIX), dir=engine_env.cache_dir()))
    for source in (toolchain.torch_wheelhouse("3.11"), toolchain.torch_wheelhouse(SECOND_PYTHON)):
        for wheel in source.glob("*.whl"):
            name = wheel.name.split("-")[0]
            if any(p.name.split("-")[0] == name and SECOND_CP not in wheel.name for p in root.iterdir()):
                continue
            os.link(wheel, root / wheel.name)
    return root


@pytest.fixture(scope="session")
def index_dir() -> Iterator[Path]:
    """The directory the index serves. It is listed on every request: a test may add a release
    to it (and takes it out again)."""
    path = _index_dir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def torch_index(index_dir: Path) -> Iterator[str]:
    """The simple index URL, served for the whole run on each worker that asks for it."""
    with engine_env.pypi_server([index_dir]) as index:
        yield index


@pytest.fixture(scope="session")
def second_cpython() -> Iterator[Future[Path]]:
    """The second CPython's prefix, compiled on first use (CPU) while the wheelhouses download."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        yield pool.submit(toolchain.cpython, SECOND_PYTHON)


@pytest.fixture(scope="session")
def stock(second_cpython: Future[Path], torch_index: str) -> Iterator[engine_env.Stock]:
    with engine_env.docker_engine() as engine:
        client = engine.client
        bases = engine_env.base_images(client)
        base = engine_env.cuda_devel_standin(client, bases.devel, toolchain.cuda_home())
        prefix = second_cpython.result()
        base = engine_env.python_standin(client, base, prefix, SECOND_PYTHON, engine_env.STOCK_PYTHON_TAG)
        runtime = engine_env.python_standin(client, bases.runtime, prefix, SECOND_PYTHON, engine_env.STOCK_RUNTIME_TAG)
        base = engine_env.uid_taken(client, base, engine_env.STOCK_TAG)
        yield engine_env.Stock(engine, base, torch_index, SECOND_PYTHON, runtime)


@pytest.fixture(scope="session")
def registry() -> Iterator[engine_env.Registry]:
    """One registry for the run. The pull module's push of the stock base then finds every layer
    of it there already (the first build pushed them, under its image): the engine mounts them
    from that repository instead of compressing the base again, as it would for a user's."""
    passwords = {user: secrets.token_urlsafe(24) for user in (engine_env.PUSH_USER, engine_env.PULL_USER)}
    with engine_env.local_registry(users=passwords) as address:
        yield engine_env.Registry(address, passwords)


@pytest.fixture(scope="session")
def project(tmp_path_factory, stock: engine_env.Stock, registry: engine_env.Registry) -> build_project.Project:
    """The build story's project, for the whole run: test_torch_release_loop.py goes on from it."""
    return build_project.make_project(tmp_path_factory, stock, registry)


@pytest.fixture(scope="session")
def first_build(project: build_project.Project):
    """The build story's first build, once a run: every module that needs a published build
    stands on this one."""
    return build_project.run_first_build(project)

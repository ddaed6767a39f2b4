"""The project of the build story (tests/engine/test_build_engine.py), shared with the modules
that go on from its first build (tests/engine/test_torch_release_loop.py): the fixtures
``project`` and ``first_build`` (tests/engine/conftest.py) are the run's, so a later module
stands on the same published build instead of compiling its own.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import engine_env
import yaml
from fixtures.tiny import make_tiny_sdist

from fa_images.builder.source import sha256_of
from fa_images.outputs import signing

REPO = Path(__file__).resolve().parents[2]
GOOD, BROKEN, INTERRUPTED = "2.8.3.dev0", "2.8.3.dev1", "2.8.3.dev2"
# A second good build, whose image differs from GOOD's only in flash-attn: an update of an image.
UPDATE = "2.8.3.dev3"
# The registry wants a login; the pushes get it the way a user's `docker login` leaves it.
REGISTRY_USER = engine_env.PUSH_USER
BUILDKIT_CLI = Path("/usr/bin/docker")  # Debian's docker.io 20.10: `DOCKER_BUILDKIT=1 docker build`


def with_buildkit_cli(env: dict[str, str], where: Path) -> dict[str, str]:
    """``env`` with Debian's 20.10 CLI first on PATH, through a link in ``where`` (another docker
    CLI may come first here, one without BuildKit)."""
    assert BUILDKIT_CLI.is_file(), f"{BUILDKIT_CLI} (Debian's docker.io, which .ci/setup installs) is missing"
    cli = where / "buildkit-cli"
    cli.mkdir(exist_ok=True)
    if not (cli / "docker").is_symlink():
        (cli / "docker").symlink_to(BUILDKIT_CLI)
    return {**env, "PATH": f"{cli}:{env['PATH']}"}


@dataclass
class Project:
    dir: Path
    env: dict[str, str]
    registry: str
    client: object
    stock: engine_env.Stock
    password: str = ""

    def matrix(
        self,
        name: str,
        *,
        image: str,
        versions: list[str],
        pythons: tuple[str, ...] = ("3.11",),
        bases: dict[str, object] | None = None,
        builder: str = "sdk",
    ) -> Path:
        data = {
            "image": image,
            "bases": bases or self.stock.bases(),  # Debian bookworm ships Python 3.11
            "packages": self.stock.packages(),
            "build": {"network": "host", "builder": builder},
            "compat": "compat.yaml",
            "entries": [
                {"python": py, "torch": "2.9.1", "cuda": "12.8", "flash_attn": v, "archs": ["80"]}
                for v in versions
                for py in pythons
            ],
        }
        path = self.dir / name
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def buildkit_env(self, **extra: str) -> dict[str, str]:
        """The project's environment with Debian's 20.10 CLI first on PATH."""
        return {**with_buildkit_cli(self.env, self.dir), **extra}

    def run(self, *args: str, timeout: int = 1800, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "fa_images", *args],
            cwd=self.dir,
            env=env or self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def entry_id(version: str, python: str = "3.11") -> str:
    return f"fa{version}-py{python}-torch2.9.1-cu128"


def make_project(tmp_path_factory, stock: engine_env.Stock, registry: engine_env.Registry) -> Project:
    """The project of the build story: four tiny sdists, a compat override that pins them, the
    registry's login, caches of its own."""
    root = tmp_path_factory.mktemp("build-engine")
    sdists = root / "sdists"
    sdists.mkdir()
    shas = {}
    for version, broken in ((GOOD, False), (BROKEN, True), (INTERRUPTED, False), (UPDATE, False)):
        sdist = make_tiny_sdist(sdists, version=version, broken=broken)
        shas[version] = sha256_of(sdist)
    # The tiny versions are not on PyPI: a compat override pins their sha256, as a user would.
    (root / "compat.yaml").write_text(
        yaml.safe_dump({"flash_attn": {v: {"sha256": s, "cuda_archs_env": True} for v, s in shas.items()}})
    )
    password = registry.passwords[REGISTRY_USER]
    env = stock.engine.env(
        XDG_CACHE_HOME=str(root / "cache-home"),  # sdists and compiler caches: not the user's
        PYTHONPATH=str(REPO),
        PYTHONUNBUFFERED="1",
        **registry.login_env(root, REGISTRY_USER),
    )
    return Project(
        dir=root, env=env, registry=registry.address, client=stock.engine.client, stock=stock, password=password
    )


def run_first_build(project: Project) -> tuple[subprocess.CompletedProcess, dict[str, dict]]:
    """One build of three entries: two good ones of one torch, one whose compile fails; pushed and
    signed with the project's key (``keys/``)."""
    matrix = project.matrix(
        "matrix.yaml", image=f"{project.registry}/fa-images-test/flash-attn", versions=[GOOD, BROKEN, UPDATE]
    )
    # Signed: its pushed images and its wheels carry their attestations (test_signed_engine.py).
    signing.create_keys(project.dir / "keys")
    started = time.monotonic()
    key = str(project.dir / "keys" / signing.PRIVATE_KEY)
    proc = project.run("build", "--matrix", str(matrix), "--push", "--sign-key", key, "--report", "report.json")
    print(f"first build: {time.monotonic() - started:.0f} s\n{proc.stderr[-4000:]}")
    report = json.loads((project.dir / "report.json").read_text())
    return proc, {e["id"]: e for e in report["entries"]}


@contextlib.contextmanager
def only_in_the_registry(project: Project, ref: str) -> Iterator[None]:
    """The engine without ``ref`` by name, as a runner that starts empty; its layers kept under
    another tag for the tests after this one, and ``ref`` tagged again at the end."""
    kept = "fa-images-test/kept:published"
    project.client.images.get(ref).tag(kept)
    project.client.images.remove(ref)
    try:
        yield
    finally:
        project.client.images.get(kept).tag(ref)
        project.client.images.remove(kept)

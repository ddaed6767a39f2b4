"""The first run on a fresh engine: `fa-images build` pulls the base images it lacks, with
progress, from a registry that wants a login (a real `docker-registry` standing in for Docker
Hub or a mirror), checks them, and builds; `--pull never` refuses at once with both ways to
provide them; a base without the Python asked for is refused before any compile.

The registry serves the stock base under a name the engine does not hold, so the pulled image
is the stock one, id for id: the torch stage (and, after test_build_engine.py, the compile
of the same sdist) is a layer-cache hit, and this module adds little to the suite. The registry
is the run's one (tests/engine/conftest.py), where test_build_engine.py pushed an image on this
base: the engine mounts the base's layers from there instead of compressing them again. That
base is devel and runtime alike, as for every Docker module (engine_env.Stock); a second name
for the runtime would make the two-base shape, whose builder copies the 7 GB venv.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import engine_env
import pytest
import yaml
from fixtures.tiny import make_tiny_sdist

from fa_images.builder.source import sha256_of

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]
# test_build_engine.py's first good version: the same sdist bytes, so the same compile layers.
VERSION = "2.8.3.dev0"
USER = engine_env.PULL_USER


@dataclass
class Project:
    dir: Path
    env: dict[str, str]
    registry: str
    base: str  # the stock base as the registry names it; the engine does not hold the name at first
    password: str
    stock: engine_env.Stock

    def matrix(self, name: str, *, python: str = "3.11", **bases: str) -> Path:
        data = {
            "image": f"fa-images-test/pulled-{name}",
            "bases": {"devel": self.base, "runtime": self.base, "python": "system", **bases},
            "packages": self.stock.packages(),
            "build": {"network": "host", "builder": "sdk"},  # the legacy builder, whatever CLI is here
            "compat": "compat.yaml",
            "entries": [{"python": python, "torch": "2.9.1", "cuda": "12.8", "flash_attn": VERSION, "archs": [80]}],
        }
        path = self.dir / f"{name}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def build(self, matrix: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "fa_images", "build", "--matrix", str(matrix), "--gpus", "none", *args],
            cwd=self.dir,
            env=env or self.env,
            capture_output=True,
            text=True,
            timeout=3000,
        )


def _push(client, image: str, ref: str, password: str) -> list[str]:
    """Push ``image`` as ``ref``; the statuses of its layers (``Pushed``, ``Mounted from …``)."""
    client.images.get(image).tag(ref)
    repository, tag = ref.rsplit(":", 1)
    auth = {"username": USER, "password": password}
    done = []
    for chunk in client.api.push(repository, tag=tag, stream=True, decode=True, auth_config=auth):
        assert "error" not in chunk, chunk
        status = chunk.get("status", "")
        if status in ("Pushed", "Layer already exists") or status.startswith("Mounted from"):
            done.append(status)
    client.images.remove(ref)  # only the name: the stock tag keeps the image
    return done


@pytest.fixture(scope="module")
def project(tmp_path_factory, stock: engine_env.Stock, registry: engine_env.Registry):
    root = tmp_path_factory.mktemp("pull-engine")
    sha = sha256_of(make_tiny_sdist(root / "sdists", version=VERSION))
    pinned = {"flash_attn": {VERSION: {"sha256": sha, "cuda_archs_env": True}}}
    (root / "compat.yaml").write_text(yaml.safe_dump(pinned))
    password = registry.passwords[USER]
    client = stock.engine.client
    ref = f"{registry.address}/fa-images-test/base:1"
    started = time.monotonic()
    layers = _push(client, stock.base, ref, password)
    mounted = sum(status.startswith("Mounted from") for status in layers)
    print(
        f"the stock base pushed to the registry in {time.monotonic() - started:.1f} s "
        f"({mounted} of {len(layers)} layers mounted from another repository there)"
    )
    env = stock.engine.env(
        PYTHONPATH=str(REPO),
        PYTHONUNBUFFERED="1",
        XDG_CACHE_HOME=str(root / "cache-home"),
        **registry.login_env(root, USER),
    )
    try:
        yield Project(root, env, registry.address, ref, password, stock)
    finally:
        if client.images.list(name=ref.rsplit(":", 1)[0]):
            client.images.remove(ref)


def test_pull_never_refuses_in_an_instant_with_both_ways(project):
    matrix, times = project.matrix("never"), []
    for _ in range(3):  # the best of three: the CPUs of a test machine are shared
        started = time.monotonic()
        proc = project.build(matrix, "--pull", "never")
        times.append(time.monotonic() - started)
        assert proc.returncode == 3, proc.stderr
        if times[-1] < 2:
            break
    print(f"--pull never refused in {', '.join(f'{t:.2f}' for t in times)} s (the whole command)")
    assert min(times) < 2, times
    lines = proc.stderr.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("error:"))
    error, hint = lines[at : at + 2]
    assert error == f"error: 1 base image not in the engine: {project.base}; --pull never forbids pulling"
    assert f"docker pull {project.base}" in hint
    assert "docker load -i base.tar" in hint and "bases.devel / bases.runtime" in hint and "local tag" in hint
    assert not (project.dir / "logs").exists()  # no entry started


def test_a_pull_that_fails_names_the_image_before_any_compile(project):
    absent = project.base.replace(":1", ":no-such-tag")
    proc = project.build(project.matrix("unknown", devel=absent, runtime=absent))  # nothing else pulled
    assert proc.returncode == 3, proc.stderr
    assert f"error: cannot pull base image {absent}: pull of" in proc.stderr
    assert "Traceback" not in proc.stderr and not (project.dir / "logs").exists()
    # Without the login the client config gives, the registry refuses: one line, with the fix.
    no_login = project.dir / "no-docker-config"
    no_login.mkdir()
    proc = project.build(project.matrix("nologin"), env={**project.env, "DOCKER_CONFIG": str(no_login)})
    assert proc.returncode == 3, proc.stderr
    assert "error: cannot pull base image" in proc.stderr and f"docker login {project.registry}" in proc.stderr


@pytest.fixture(scope="module")
def pulled(project):
    started = time.monotonic()
    proc = project.build(project.matrix("first"), "--report", "report.json")
    took = time.monotonic() - started
    print(f"the first build on an engine without its bases: {took:.1f} s")
    print(f"{proc.stderr[:3000]}\n…\n{proc.stderr[-2000:]}")
    return proc


def test_build_pulls_the_missing_bases_with_progress_and_succeeds(project, pulled):
    assert pulled.returncode == 0, pulled.stderr[-4000:]
    err = pulled.stderr
    assert f"pull {project.base} · " in err  # a line per layer's status
    assert f"✓ pull {project.base} (" in err  # and one per image, with its time, id and size
    assert "pulled 1 base image in " in err and "(--pull missing)" in err
    assert err.index("pulled 1 base image") < err.index("[1/1]")  # before the entry starts
    assert f"✓ preflight {project.base} (" in err and "python3.11 " in err and "nvcc 12." in err
    (entry,) = json.loads((project.dir / "report.json").read_text())["entries"]
    assert entry["status"] == "ok" and entry["wheel"] and entry["check"] == "passed", entry
    # The login came from the credential helper and went to the engine only.
    assert project.password not in pulled.stdout + err
    for path in [project.dir / "report.json", *(project.dir / "logs").iterdir()]:
        assert project.password not in path.read_text(errors="replace"), path


def test_preflight_refuses_a_base_without_the_python_before_any_compile(project, pulled):
    # The stock base has Debian's 3.11 and the second Python the engine tier compiled, not 3.10.
    absent = "3.10"
    assert absent not in ("3.11", project.stock.second_python)
    started = time.monotonic()
    proc = project.build(project.matrix("no-python", python=absent), "--dist", "dist-no-python")
    took = time.monotonic() - started
    print(f"preflight refusal in {took:.1f} s (the whole command)\n{proc.stderr}")
    assert proc.returncode == 3, proc.stderr
    assert f"error: base image {project.base} has no python{absent} on its PATH" in proc.stderr
    assert "set bases.python: uv" in proc.stderr
    assert "pull " not in proc.stderr  # pulled by the first build: nothing to pull
    assert not (project.dir / "dist-no-python").exists() and "Step 1/" not in proc.stderr
    assert took < 30, took

"""`fa-images build` against Podman, through its Docker-compatible API.

The same real parts as tests/engine/test_build_engine.py (Debian base images, the CUDA devel stand-in,
torch 2.9.1 from the tests' local index, the tiny flash-attn-shaped extension), but the engine is
Debian's podman (`podman system service`), with nothing in fa-images told so. The stand-in is both
bases here, so the compile runs on the torch stage itself (the one-base shape).

No push here: what a push asks of the engine (the digest it returns is the one the registry serves,
a refused push is one line) is the engine contract's, which runs over Podman too
(tests/engine/test_engine_contract_engine.py) on a small image. Pushing this 7.9 GB image again
would only compress its torch layer once more: two minutes of one core.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import engine_env
import pytest
import toolchain
import yaml
from fixtures.tiny import make_tiny_sdist

from fa_images.builder.source import sha256_of

# An engine of its own, not the tier's shared Docker Engine: a group of its own for
# pytest-xdist, so it runs on the other worker, beside the Docker modules.
pytestmark = [pytest.mark.engine, pytest.mark.xdist_group("podman")]

REPO = Path(__file__).resolve().parents[2]
VERSION = "2.8.3.dev0"
ENTRY = f"fa{VERSION}-py3.11-torch2.9.1-cu128"


@pytest.fixture(scope="module")
def built(tmp_path_factory, torch_index: str):
    root = tmp_path_factory.mktemp("podman")
    sha = sha256_of(make_tiny_sdist(root / "sdists", version=VERSION))
    (root / "compat.yaml").write_text(
        yaml.safe_dump({"flash_attn": {VERSION: {"sha256": sha, "cuda_archs_env": True}}})
    )
    with engine_env.podman_engine() as engine:
        bases = engine_env.base_images(engine.client)
        devel = engine_env.cuda_devel_standin(engine.client, bases.devel, toolchain.cuda_home())
        matrix = {
            "image": f"{engine_env.TEST_NAMESPACE}podman",
            "bases": {"devel": devel, "runtime": devel, "python": "system"},
            "packages": engine_env.index_packages(torch_index),
            "build": {"network": "host"},
            "compat": "compat.yaml",
            "entries": [{"python": "3.11", "torch": "2.9.1", "cuda": "12.8", "flash_attn": VERSION, "archs": ["80"]}],
        }
        (root / "matrix.yaml").write_text(yaml.safe_dump(matrix, sort_keys=False))
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "fa_images",
                "build",
                "--matrix",
                "matrix.yaml",
                "--report",
                "report.json",
            ],
            cwd=root,
            env=engine.env(PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", XDG_CACHE_HOME=str(root / "cache-home")),
            capture_output=True,
            text=True,
            timeout=3000,
        )
        print(proc.stderr[-6000:])
        report = json.loads((root / "report.json").read_text())
        yield engine.client, proc, report["entries"][0], root


def test_the_entry_builds_checks_and_exports_on_podman(built):
    client, proc, entry, root = built
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stderr.startswith("engine: Podman Engine 4.")
    assert entry["status"] == "ok" and entry["check"] == "passed", entry
    wheel = Path(entry["wheel"])
    assert wheel.is_file() and sha256_of(wheel) == entry["wheel_sha256"]
    assert json.loads((root / "dist" / "manifest.json").read_text())["wheels"][wheel.name]["entry"] == ENTRY
    assert entry["pushed"] is None and client.images.get(entry["image"]).labels["fa-images.entry"] == ENTRY


def test_no_container_is_left_behind_on_podman(built):
    client = built[0]
    assert client.containers.list(all=True, ignore_removed=True) == []

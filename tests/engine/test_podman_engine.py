"""`fa-images build` against Podman, through its Docker-compatible API.

The same real parts as tests/engine/test_build_engine.py (Debian base images, the CUDA devel stand-in,
torch 2.9.1 from the tests' local index, a real registry, the tiny flash-attn-shaped extension), but
the engine is Debian's podman (`podman system service`), with nothing in fa-images told so.

It builds the two-base shape, as on NVIDIA's images: the torch stage on a runtime base with no
compiler, the builder on the CUDA devel stand-in with the torch stage's venv copied in. (The
Docker modules build on one base, devel and runtime alike, and copy no venv: engine_env.Stock.)
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
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
    with engine_env.podman_engine() as engine, engine_env.local_registry() as registry:
        bases = engine_env.base_images(engine.client)
        devel = engine_env.cuda_devel_standin(engine.client, bases.devel, toolchain.cuda_home())
        matrix = {
            "image": f"{registry}/fa-images-test/podman",
            "bases": {"devel": devel, "runtime": bases.runtime, "python": "system"},
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
                "--push",
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
        yield engine.client, proc, report["entries"][0], root, registry


def test_the_entry_builds_checks_exports_and_pushes_on_podman(built):
    _, proc, entry, root, _ = built
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stderr.startswith("engine: Podman Engine 4.")
    assert entry["status"] == "ok" and entry["check"] == "passed", entry
    wheel = Path(entry["wheel"])
    assert wheel.is_file() and sha256_of(wheel) == entry["wheel_sha256"]
    assert json.loads((root / "dist" / "manifest.json").read_text())["wheels"][wheel.name]["entry"] == ENTRY
    assert entry["pushed"].startswith("sha256:")


def test_the_pushed_image_is_in_the_registry(built):
    _, _, entry, _, registry = built
    repository, tag = entry["image"].removeprefix(registry + "/").rsplit(":", 1)

    accept = "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"
    request = urllib.request.Request(f"http://{registry}/v2/{repository}/manifests/{tag}", headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200 and json.loads(answer.read())["layers"]


def _run(client, image: str, command: str) -> tuple[int, str]:
    """``sh -c command`` in a fresh container on Podman, then removed: its exit code and stdout."""
    container = client.containers.create(image, ["sh", "-c", command])
    try:
        container.start()
        code = container.wait()["StatusCode"]
        return code, container.logs(stdout=True, stderr=False).decode(errors="replace")
    finally:
        container.remove(force=True)


def test_the_runtime_image_holds_no_compiler_and_the_builder_compiled_on_its_torch(built):
    """The runtime base has no compiler and gets none; the builder, on the devel base, compiled
    against the torch stage's venv, copied file for file."""
    client, _, entry, _, _ = built
    image = entry["image"]
    code, out = _run(client, image, "command -v nvcc g++; ls /usr/local/cuda /opt/build-tools 2>&1; true")
    assert "nvcc" not in out.split("ls:")[0] and "g++" not in out.split("ls:")[0], out
    assert out.count("No such file") == 2, out
    # The same torch install: its version, place and RECORD (every file's sha256, as pip wrote it).
    torch = (
        "python -c 'import torch; print(torch.__version__, torch.__file__)'; "
        "sha256sum /opt/venv/lib/*/site-packages/torch-*.dist-info/RECORD"
    )
    in_runtime, in_builder = (_run(client, ref, torch) for ref in (image, f"{image}-builder"))
    assert in_runtime == in_builder and in_runtime[1].startswith("2.9.1+cu128 /opt/venv/"), (in_runtime, in_builder)
    code, out = _run(client, f"{image}-builder", "command -v nvcc")
    assert code == 0 and out.strip() == "/usr/local/cuda/bin/nvcc", out


def test_no_container_is_left_behind_on_podman(built):
    client = built[0]
    assert client.containers.list(all=True) == []

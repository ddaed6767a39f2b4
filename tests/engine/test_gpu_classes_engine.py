"""A mixed fleet on one torch: a target axis of two GPU classes builds an image and a wheel per
class, side by side, and a node's pip or uv asks for its class by the wheel's +label.

The build story's project (build_project.py) goes on: its engine, CUDA stand-in, torch stage and
tiny sdist. The archs-80 class is the first build's compile group, so its kernel comes from the
compiler cache the first build left on the host; the archs-90 class compiles.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import engine_env
import pytest
import yaml
from build_project import GOOD, Project

pytestmark = pytest.mark.engine

IMAGE = "fa-images-test/flash-attn-classes"
BASE_ID = f"fa{GOOD}-py3.11-torch2.9.1-cu128"
LABEL = "cu128torch2.9cxx11abitrue"


@dataclass
class Classes:
    proc: subprocess.CompletedProcess
    entries: dict[str, dict]  # the report's, by id
    dist: Path


@pytest.fixture(scope="module")
def classes(project: Project, first_build) -> Iterator[Classes]:
    matrix = {
        "image": IMAGE,
        "bases": project.stock.bases(),
        "packages": project.stock.packages(),
        "build": {"network": "host", "builder": "sdk"},  # the first build's, whose torch stage it takes
        "compat": "compat.yaml",
        "matrix": {
            "python": ["3.11"],
            "torch": ["2.9.1"],
            "cuda": ["12.8"],
            "flash_attn": [GOOD],
            "target": [["A100"], ["H100"]],  # AWS p4d and p5: one class each
        },
    }
    (project.dir / "classes.yaml").write_text(yaml.safe_dump(matrix, sort_keys=False))
    args = ("--matrix", "classes.yaml", "--gpus", "none", "--dist", "dist-classes", "--report", "classes.json")
    proc = project.run("build", *args)
    print(proc.stderr[-4000:])
    report = json.loads((project.dir / "classes.json").read_text())
    yield Classes(proc, {e["id"]: e for e in report["entries"]}, project.dir / "dist-classes")
    engine_env.remove_images(project.client, IMAGE)


def test_each_gpu_class_has_its_own_image_and_wheel(project: Project, classes: Classes) -> None:
    assert classes.proc.returncode == 0, classes.proc.stderr[-3000:]
    assert sorted(classes.entries) == [f"{BASE_ID}-sm80", f"{BASE_ID}-sm90"]
    images = {}
    for archs in ("80", "90"):
        entry = classes.entries[f"{BASE_ID}-sm{archs}"]
        assert entry["status"] == "ok" and entry["check"] == "passed", entry
        assert entry["image"] == f"{IMAGE}:{BASE_ID}-sm{archs}"
        image = project.client.images.get(entry["image"])
        assert image.labels["fa-images.archs"] == archs
        images[archs] = image.id
        assert Path(entry["wheel"]).name.startswith(f"flash_attn-{GOOD}+{LABEL}.sm{archs}-cp311-cp311-")
    assert images["80"] != images["90"]
    # The first build's group: its kernel from the cache the host kept; the other class compiled.
    assert classes.entries[f"{BASE_ID}-sm80"]["kernels_from_cache"] > 0
    manifest = json.loads((classes.dist / "manifest.json").read_text())["wheels"]
    assert sorted(record["entry"] for record in manifest.values()) == sorted(classes.entries)


@contextlib.contextmanager
def served(directory: Path) -> Iterator[str]:
    """``directory`` over http on 127.0.0.1, as a node's pip and uv read an index: its base URL."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}/"
        finally:
            server.shutdown()


@pytest.mark.parametrize("archs", ["80", "90"])
def test_pip_and_uv_take_each_class_from_its_index_and_uv_from_the_one_index_as_a_variant(
    classes: Classes, tmp_path: Path, archs
) -> None:
    """The built wheels as a node gets them: pip and uv, pinned, from the class's index; uv with wheel
    variants, unpinned, from the one index, its NVIDIA provider answered as a node of that class."""
    wanted = f"flash-attn=={GOOD}+{LABEL}.sm{archs}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PIP_", "NV_VARIANT_"))}
    env["UV_CACHE_DIR"] = str(tmp_path / "uv-cache")
    uv = shutil.which("uv") or "uv"
    with served(classes.dist) as base:
        index = f"{base}sm{archs}/simple/"
        pip = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--index-url", index,
             "--dest", str(tmp_path / "pip"), wanted],
            capture_output=True, text=True, env=env, timeout=300,
        )  # fmt: skip
        assert pip.returncode == 0, pip.stdout + pip.stderr
        (got,) = (tmp_path / "pip").glob("*.whl")
        assert got.name.startswith(f"flash_attn-{GOOD}+{LABEL}.sm{archs}-"), got.name
        venv = tmp_path / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        pinned = subprocess.run(
            [uv, "pip", "install", "--no-config", "--dry-run", "--no-deps",
             "--python", str(venv / "bin" / "python"), "--index-url", index, wanted],
            capture_output=True, text=True, env=env, timeout=300,
        )  # fmt: skip
        assert pinned.returncode == 0, pinned.stdout + pinned.stderr
        assert f"+ flash-attn=={GOOD}+{LABEL}.sm{archs}" in pinned.stderr
        node = env | {"NV_VARIANT_PROVIDER_FORCE_CUDA_DRIVER_VERSION": "12.8",
                      "NV_VARIANT_PROVIDER_FORCE_SM_ARCH": f"{archs[0]}.0"}  # fmt: skip
        varied = subprocess.run(
            [uv, "pip", "install", "--no-config", "--no-deps", "--preview-features", "wheel-variants",
             "--python", str(venv / "bin" / "python"), "--index-url", f"{base}simple/", "flash-attn"],
            capture_output=True, text=True, env=node, timeout=300,
        )  # fmt: skip
    assert varied.returncode == 0, varied.stdout + varied.stderr
    (info,) = (venv / "lib").glob(f"python3*/site-packages/flash_attn-{GOOD}+{LABEL}.dist-info")
    assert list(json.loads((info / "variant.json").read_text())["variants"]) == [f"sm{archs}"]

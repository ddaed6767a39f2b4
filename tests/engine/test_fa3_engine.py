"""FlashAttention-3 through `fa-images build` on a real Docker Engine.

The build story's project (build_project.py) goes on: its engine, CUDA stand-in (nvcc 12.4),
torch 2.9.1 stage and index. FA3's source is a tiny stand-in (tests/fixtures/tiny_fa3_hopper/)
made into an archive from two real git repositories by `fa-images source fa3`, pinned by a compat
override as a site pins its own archive: one small kernel for sm_90a and sm_80, on torch's stable
ABI, tagged abi3. The real FA3 was built and GPU-checked on an H100 (bench/gpu_container.md).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

import engine_env
import pytest
import toolchain
import yaml
from build_project import Project
from fixtures import tiny_fa3

from fa_images.builder.generations import fa3

pytestmark = pytest.mark.engine

VERSION = "3.0.0.dev0"
BUILD = fa3.Fa3Build(head_dims=(128,), without=("split",))
ENTRY = f"fa{VERSION}-py3.11-torch2.9.1-cu128"
IMAGE = "fa-images-test/flash-attn-3"


@dataclass
class Fa3Build:
    source: object  # `fa-images source fa3`
    proc: object  # `fa-images build`
    entry: dict  # its report's entry


@pytest.fixture(scope="module")
def built(project: Project, first_build) -> Fa3Build:
    """The archive made from two git clones, then one FA3 entry built on the first build's torch stage."""
    fa, cutlass, commit = tiny_fa3.make_repos(project.dir / "fa3-repos", version=VERSION, buildable=True)
    source = project.run(
        "source", "fa3", "--flash-attention", str(fa), "--commit", commit, "--cutlass", str(cutlass), "--out", "sdists"
    )
    assert source.returncode == 0, source.stderr
    sha = re.search(r"^sha256 of the tar inside: ([0-9a-f]{64})$", source.stdout, re.MULTILINE)
    assert sha, source.stdout
    sub = tiny_fa3.git(fa, "rev-parse", "HEAD:csrc/cutlass")
    compat = yaml.safe_load((project.dir / "compat.yaml").read_text())
    compat["flash_attn_3"] = {
        VERSION: {"sha256": sha.group(1), "flash_attention": commit, "cutlass": sub, "runtime_deps": ["ninja==1.13.2"]}
    }
    (project.dir / "compat-fa3.yaml").write_text(yaml.safe_dump(compat))
    matrix = {
        "image": IMAGE,
        "bases": project.stock.bases(),
        "packages": project.stock.packages(),
        "build": {"network": "host", "builder": "sdk"},  # the first build's, whose torch stage it takes
        "compat": "compat-fa3.yaml",
        "fa3": {"head_dims": list(BUILD.head_dims), "without": list(BUILD.without)},
        "entries": [{"python": "3.11", "torch": "2.9.1", "cuda": "12.8", "flash_attn": VERSION, "target": ["H100"]}],
    }
    (project.dir / "fa3.yaml").write_text(yaml.safe_dump(matrix, sort_keys=False))
    started = time.monotonic()
    proc = project.run("build", "--matrix", "fa3.yaml", "--gpus", "none", "--report", "fa3.json")
    print(f"FA3 build: {time.monotonic() - started:.0f} s\n{proc.stderr[-4000:]}")
    (entry,) = json.loads((project.dir / "fa3.json").read_text())["entries"]
    yield Fa3Build(source, proc, entry)
    engine_env.remove_images(project.client, IMAGE)


def test_the_fa3_entry_builds_its_abi3_wheel_from_the_pinned_archive(project: Project, built: Fa3Build) -> None:
    assert built.proc.returncode == 0, built.proc.stderr[-3000:]
    assert built.entry["id"] == ENTRY and built.entry["check"] == "passed", built.entry
    assert built.entry["gpu_check"].startswith("skipped")  # no GPU here: never "passed"
    wheel = Path(built.entry["wheel"])
    label = fa3.local_version_label("12.8", BUILD)
    assert re.fullmatch(
        rf"flash_attn_3-{re.escape(VERSION)}\+{re.escape(label)}-cp39-abi3-manylinux_2_\d+_x86_64\.whl", wheel.name
    )
    assert wheel.parent == (project.dir / "dist").resolve()
    manifest = json.loads((project.dir / "dist" / "manifest.json").read_text())["wheels"][wheel.name]
    assert manifest["entry"] == ENTRY
    # The verifier a user runs, with a torch >= 2.9 beside it: the build record and the cubins.
    venv_python = toolchain.torch_venv() / "bin" / "python"
    inspect = project.run("inspect", str(wheel), "--python", str(venv_python))
    assert inspect.returncode == 0, inspect.stdout + inspect.stderr
    assert f"✓ FA3 build: {BUILD.describe()}" in inspect.stdout, inspect.stdout
    # Read from the ELF (no cuobjdump here), sm_90a's cubin reads as sm_90; the build record says 90a.
    assert "✓ GPU code: sm_80, sm_90 " in inspect.stdout, inspect.stdout
    assert "✓ import" in inspect.stdout


def test_the_fa3_image_says_what_it_holds_and_imports_next_to_its_torch(project: Project, built: Fa3Build) -> None:
    image = project.client.images.get(built.entry["image"])
    labels = image.labels
    assert labels["fa-images.generation"] == "3" and labels["fa-images.fa3-build"] == BUILD.describe()
    assert labels["fa-images.flash-attn"] == VERSION
    out = project.client.containers.run(built.entry["image"], remove=True).decode()
    assert "flash_attn_3 imports next to torch 2.9.1" in out, out


def test_check_on_a_node_without_a_gpu_gives_the_fa3_image_the_no_gpu_verdict(
    project: Project, built: Fa3Build
) -> None:
    proc = project.run("check", built.entry["image"], "--json", "--gpus", "none", "--pull", "never", timeout=600)
    assert proc.returncode == 3, proc.stderr[-3000:]
    (result,) = json.loads(proc.stdout)["images"]
    assert result["verdict"] == "no GPU" and result["labels"]["flash_attn"] == VERSION

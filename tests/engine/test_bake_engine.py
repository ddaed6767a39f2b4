"""`fa-images export bake`, built by `docker buildx bake` for real.

The bake file's contexts are the ones `fa-images build --builder buildkit` assembles, in the
two-base shape: the torch stage on a runtime base without a compiler, the compile on the CUDA
devel stand-in with the torch venv mounted. buildx is Debian 13's (0.13, the newest a registry here
has): its bake file has no network key, so its builds take the engine's default bridge, which the
tier's shared engine lacks by design. This module's engine has one, in a network namespace of its
own, with the torch index served there (``engine_env.bridged_docker_engine``). An engine of its own
is a group of its own for pytest-xdist: it runs on the other worker, beside the Docker modules.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import engine_env
import pytest
import toolchain
import yaml
from fixtures.tiny import make_tiny_sdist

from fa_images.builder.source import sha256_of
from fa_images.outputs.exports import slug

pytestmark = [pytest.mark.engine, pytest.mark.xdist_group("bake")]

REPO = Path(__file__).resolve().parents[2]
VERSION = "2.8.3.dev0"
ENTRY = f"fa{VERSION}-py3.11-torch2.9.1-cu128"
IMAGE = f"{engine_env.TEST_NAMESPACE}bake:{ENTRY}"
DEVEL_WITH_GIT = f"{engine_env.TEST_NAMESPACE}debian:{engine_env.SUITE}-devel-git"


@pytest.fixture(scope="module")
def baked(tmp_path_factory, index_dir: Path):
    root = tmp_path_factory.mktemp("bake")
    sha = sha256_of(make_tiny_sdist(root / "sdists", version=VERSION))
    (root / "compat.yaml").write_text(
        yaml.safe_dump({"flash_attn": {VERSION: {"sha256": sha, "cuda_archs_env": True}}})
    )
    with (
        engine_env.bridged_docker_engine() as bridged,
        engine_env.pypi_server([index_dir], netns=bridged.netns, host=engine_env.BRIDGE_GATEWAY) as index,
    ):
        engine, client = bridged.engine, bridged.engine.client
        runtime = engine_env.base_images(client).runtime
        # With git: the builder stage installs it where the base lacks it, from Debian's mirror, which
        # this engine's namespace cannot reach (the shared engine's builds take the host's network).
        debian = engine_env.debian_base(client, DEVEL_WITH_GIT, (*engine_env.DEVEL_PACKAGES, "git"))
        devel = engine_env.cuda_devel_standin(client, debian, toolchain.cuda_home())
        matrix = {
            "image": IMAGE.rpartition(":")[0],
            "bases": {"devel": devel, "runtime": runtime, "python": "system"},
            # Plain http off loopback, at the bridge's gateway: pip is told to trust that host.
            "packages": engine_env.index_packages(index),
            "compat": "compat.yaml",
            "entries": [{"python": "3.11", "torch": "2.9.1", "cuda": "12.8", "flash_attn": VERSION, "archs": ["80"]}],
        }
        (root / "matrix.yaml").write_text(yaml.safe_dump(matrix, sort_keys=False))
        env = engine.env(PYTHONPATH=str(REPO), XDG_CACHE_HOME=str(root / "cache-home"))
        argv = ["export", "bake", "--matrix", "matrix.yaml", "--out-dir", "out"]
        export = _run([sys.executable, "-m", "fa_images", *argv], root, env)
        assert export.returncode == 0, export.stderr
        bake_env = {**env, "DOCKER_CONFIG": str(toolchain.buildx_config())}
        bake = _run(["docker", "buildx", "bake", "--progress", "plain"], root / "out", bake_env)
        print(bake.stderr[-6000:])
        again = _run(["docker", "buildx", "bake", "--progress", "plain"], root / "out", bake_env)
        yield client, root, bake, again, devel
        for ref in (IMAGE, f"{IMAGE}-builder"):
            client.images.remove(ref, force=True)


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=2400)


def test_bake_builds_the_image_the_builder_and_the_wheel_of_the_export(baked) -> None:
    client, root, bake, _, _ = baked
    assert bake.returncode == 0, bake.stderr[-4000:]
    labels = client.images.get(IMAGE).labels
    assert labels["fa-images.entry"] == ENTRY and labels["fa-images.torch"] == "2.9.1", labels
    assert client.images.get(f"{IMAGE}-builder").id
    # The torch stage reached the index at the bridge's gateway, over plain http.
    assert f"--trusted-host {engine_env.BRIDGE_GATEWAY}:" in bake.stderr
    wheels = sorted((root / "out" / "wheels" / slug(ENTRY)).glob("*.whl"))
    assert len(wheels) == 1 and f"{VERSION}+cu128torch2.9cxx11abitrue-cp311-cp311-" in wheels[0].name, wheels


def test_the_baked_wheel_merges_into_dist_and_is_the_one_the_image_holds(baked) -> None:
    client, root, _, _, _ = baked
    merge = subprocess.run(
        [sys.executable, "-m", "fa_images", "dist", "merge", f"out/wheels/{slug(ENTRY)}", "--dist", "dist"],
        cwd=root,
        env=engine_env.child_env(PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert merge.returncode == 0, merge.stderr
    (wheel,) = (root / "dist").glob("*.whl")
    record = json.loads((root / "dist" / "manifest.json").read_text())["wheels"][wheel.name]
    # The builder's own record: the entry's name is `fa-images build`'s to add, which bake is not.
    assert record["sha256"] == sha256_of(wheel) and record["flash_attn"] == VERSION, record
    assert (record["python"], record["cuda"], record["archs"]) == ("3.11", "12.8", ["80"]), record
    code, out, err = engine_env.run_in(client, IMAGE, "python -m fa_images.builder check --import-only")
    assert code == 0 and "bert_padding, layers.rotary, modules.mha" in out, out + err


def test_the_builder_mounts_the_torch_venv_and_holds_no_copy_of_it(baked) -> None:
    client, _, bake, _, devel = baked
    assert "--mount=type=bind,from=torch,source=/opt/venv,target=/opt/venv" in bake.stderr
    sizes = {ref: client.images.get(ref).attrs["Size"] for ref in (IMAGE, f"{IMAGE}-builder", devel)}
    added = sizes[f"{IMAGE}-builder"] - sizes[devel]
    assert added < 500e6 < 5e9 < sizes[IMAGE], sizes  # the build tools; torch 2.9.1+cu128 is 7 GB


def test_a_second_bake_builds_nothing(baked) -> None:
    _, _, _, again, _ = baked
    assert again.returncode == 0, again.stderr[-4000:]
    lines = again.stderr.splitlines()
    runs = {line.split()[0] for line in lines if re.match(r"#\d+ \[[^]]+\] RUN ", line)}
    cached = {line.split()[0] for line in lines if re.fullmatch(r"#\d+ CACHED", line.strip())}
    assert runs and runs <= cached, again.stderr[-4000:]

"""A torch release on the builder and on a node: what the torch stage's CUDA-library layers save.

Two entries that differ only in torch (2.9.1, then 2.10.0, both CUDA 12.8, Python 3.11), built
one after the other by `fa-images build --push` on one engine, with the legacy builder (the SDK's)
or BuildKit (Debian's 20.10 docker CLI), as a build farm with its layer cache builds a new torch
release. Real parts: the tests' dockerd, Debian's registry, the engine tier's torch index (torch
2.9.1's wheelhouse and the wheels that 2.10.0 adds), its CUDA stand-in base and its tiny
flash-attn-shaped sdist.

    PYTHONPATH=tests:tests/engine:. python bench/torch_release_layers.py WORK_DIR [--one-layer] [--builder buildkit]

--one-layer: the same with torch and its libraries in one layer, as before the table held their
pins (a compat override with `libraries: []` for both torches), for the side-by-side figure.
--builder buildkit: both builds through BuildKit instead of the legacy builder.

Prints, for each build, its time and the torch stage's steps (cached or run), and then, from the
registry's manifests, what a node that holds the 2.9.1 image pulls for the 2.10.0 one: the layers
and compressed bytes it lacks, against the whole image.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import engine_env
import toolchain
import yaml
from build_project import with_buildkit_cli
from fixtures.tiny import make_tiny_sdist

from fa_images.builder.source import sha256_of

VERSION = "2.8.3.dev0"
TORCHES = ("2.9.1", "2.10.0")
REPOSITORY = "fa-images-test/torch-layers"


def entry_id(torch: str) -> str:
    return f"fa{VERSION}-py3.11-torch{torch}-cu128"


def build(work: Path, env: dict[str, str], torch: str) -> None:
    started = time.monotonic()
    args = ("build", "--matrix", "matrix.yaml", "--only", entry_id(torch), "--push", "--gpus", "none",
            "--report", f"{torch}.json", "--dist", "dist", "--log-dir", "logs")  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "fa_images", *args], cwd=work, env=env, capture_output=True, text=True, timeout=3600
    )
    seconds = time.monotonic() - started
    (entry,) = json.loads((work / f"{torch}.json").read_text())["entries"]
    steps = pip_steps(Path(entry["log"]).read_text())
    print(f"RESULT torch {torch}: exit {proc.returncode}, {seconds:.0f} s, status {entry['status']}")
    for command, cached in steps:
        if "nvidia-" in command or "torch==" in command:
            print(f"  {'cached' if cached else 'ran   '}  {command.split()[-1]}")
    if proc.returncode != 0:
        print(proc.stderr[-3000:])


def pip_steps(log: str) -> list[tuple[str, bool]]:
    """The log's `RUN pip install` steps, each with whether the layer cache answered it."""
    # The legacy builder's: "Step 7/31 : RUN pip install ..." then " ---> Using cache" or a run.
    legacy = re.findall(r"^Step \d+/\d+ : (RUN pip install .*?)\n( ---> Using cache)?", log, flags=re.M)
    if legacy:
        return [(command, bool(cached)) for command, cached in legacy]
    # BuildKit's, as the build's log keeps them: "#12 [torch 3/6] RUN pip install ..." and, where
    # the step ran, "[torch 3/6] done in 4.3 s"; a step the cache answered has no such line.
    ran = set(re.findall(r"^(\[[^]]+\]) done in ", log, flags=re.M))
    steps = re.findall(r"^#\d+ (\[[^]]+\]) (RUN pip install .*)$", log, flags=re.M)
    return [(command, step not in ran) for step, command in steps]


def manifest_layers(registry: str, torch: str) -> list[dict]:
    request = urllib.request.Request(
        f"http://{registry}/v2/{REPOSITORY}/manifests/{entry_id(torch)}",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())["layers"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path)
    parser.add_argument("--one-layer", action="store_true")
    parser.add_argument("--builder", choices=("sdk", "buildkit"), default="sdk")
    args = parser.parse_args()
    work, one_layer = args.work.resolve(), args.one_layer
    shutil.rmtree(work, ignore_errors=True)
    (work / "sdists").mkdir(parents=True)
    sha = sha256_of(make_tiny_sdist(work / "sdists", version=VERSION))
    pins: dict = {"flash_attn": {VERSION: {"sha256": sha, "cuda_archs_env": True}}}
    if one_layer:
        pins["torch"] = {t: {"cuda": {"12.8": {"cxx11_abi": True, "libraries": []}}} for t in TORCHES}
    (work / "compat.yaml").write_text(yaml.safe_dump(pins))
    wheels = [toolchain.torch_wheelhouse("3.11"), toolchain.torch_release(TORCHES[1], "3.11")]
    with (
        engine_env.pypi_server(wheels) as index,
        engine_env.docker_engine() as engine,
        engine_env.local_registry() as registry,
    ):
        client = engine.client
        base = engine_env.cuda_devel_standin(client, engine_env.base_images(client).devel, toolchain.cuda_home())
        entries = [
            {"python": "3.11", "torch": torch, "cuda": "12.8", "flash_attn": VERSION, "archs": ["80"]}
            for torch in TORCHES
        ]
        matrix = {
            "image": f"{registry}/{REPOSITORY}",
            "bases": {"devel": base, "runtime": base, "python": "system"},
            "packages": engine_env.index_packages(index),
            "build": {"network": "host", "builder": args.builder},
            "compat": "compat.yaml",
            "entries": entries,
        }
        (work / "matrix.yaml").write_text(yaml.safe_dump(matrix, sort_keys=False))
        env = engine.env(PYTHONPATH=str(Path.cwd()), XDG_CACHE_HOME=str(work / "cache"))
        if args.builder == "buildkit":
            env = with_buildkit_cli(env, work)
        try:
            for torch in TORCHES:
                build(work, env, torch)
            held, new = (manifest_layers(registry, torch) for torch in TORCHES)
            have = {layer["digest"] for layer in held}
            lacking = [layer for layer in new if layer["digest"] not in have]
            total, pulled = sum(la["size"] for la in new), sum(la["size"] for la in lacking)
            print(
                f"RESULT a node with torch {TORCHES[0]}'s image pulls {len(lacking)} of {len(new)} layers for "
                f"{TORCHES[1]}'s: {pulled / 1e6:.0f} MB of {total / 1e6:.0f} MB compressed ({pulled / total:.0%}); "
                f"the layers it lacks: {[round(la['size'] / 1e6) for la in lacking]} MB"
            )
        finally:
            engine_env.remove_images(client, f"{registry}/{REPOSITORY}")
            client.images.prune(filters={"dangling": True})
            client.api.prune_builds()


if __name__ == "__main__":
    main()

"""A build cache another host imports: one entry built and pushed through BuildKit on one engine,
then built on a second engine with empty storage, pointed at the same registry.

Real parts: the tests' dockerd (host A), a second dockerd on an empty data root (host B, the
tests' ``engine_env.empty_docker_engine``: Debian's 20.10 daemon, BuildKit built in), Debian's
registry, the torch 2.9.1 index and the CUDA stand-in base of the engine tier, the tiny
flash-attn-shaped sdist. The base is pushed
to the registry and named by its registry ref, so host B pulls it like anything else.

    PYTHONPATH=tests:. python bench/cache_import.py WORK_DIR [--two-bases]

--two-bases: NVIDIA's shape, the torch stage on a runtime base without a compiler (Debian's, pushed
too) and the compile on the CUDA stand-in with the torch venv mounted, where `fa-images build`
builds the torch stage first, in a build of its own; else one base for both.

Prints, per host, the build's time, its kernels, whether the compile came from the build cache,
the image's id, and what host B's storage holds at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import engine_env
import toolchain
import yaml
from fixtures.tiny import make_tiny_sdist

from fa_images.builder.source import sha256_of

VERSION = "2.8.3.dev0"
CLI = Path("/usr/bin/docker")  # Debian's docker.io 20.10: BuildKit built in


def fa_images(work: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fa_images", *args], cwd=work, env=env, capture_output=True, text=True, timeout=3600
    )


def build(name: str, work: Path, env: dict[str, str], matrix: Path) -> None:
    started = time.monotonic()
    # A dist/ and logs of each host's own: host B starts as empty as a new runner.
    args = ("build", "--matrix", str(matrix), "--push", "--gpus", "none", "--report", f"{name}.json",
            "--dist", f"dist-{name}", "--log-dir", f"logs-{name}")  # fmt: skip
    proc = fa_images(work, env, *args)
    seconds = time.monotonic() - started
    print(proc.stderr[-2500:])
    (entry,) = json.loads((work / f"{name}.json").read_text())["entries"]
    log = Path(entry["log"]).read_text()
    print(
        f"RESULT {name}: exit {proc.returncode}, {seconds:.0f} s, status {entry['status']}, check {entry['check']}, "
        f"kernels {entry['kernels']}, compile from the build cache: "
        f"{'0 kernels compiled' in log}, image {entry['image']} ({(entry['image_size'] or 0) / 1e9:.2f} GB), "
        f"id {entry.get('image_id')}, torch installed here: {'Collecting torch==' in log}"
    )


def main() -> None:
    work = Path(sys.argv[1]).resolve()
    two_bases = sys.argv[2:] == ["--two-bases"]
    shutil.rmtree(work, ignore_errors=True)
    (work / "sdists").mkdir(parents=True)
    sha = sha256_of(make_tiny_sdist(work / "sdists", version=VERSION))
    compat = {"flash_attn": {VERSION: {"sha256": sha, "cuda_archs_env": True}}}
    (work / "compat.yaml").write_text(yaml.safe_dump(compat))
    cli_dir = work / "cli"
    cli_dir.mkdir()
    (cli_dir / "docker").symlink_to(CLI)
    with (
        engine_env.pypi_server([toolchain.torch_wheelhouse("3.11")]) as index,
        engine_env.docker_engine() as engine,
        engine_env.local_registry() as registry,
    ):
        client = engine.client
        bases = engine_env.base_images(client)
        stock = engine_env.cuda_devel_standin(client, bases.devel, toolchain.cuda_home())
        base = f"{registry}/fa-images-test/base:1"
        client.images.get(stock).tag(base)
        client.images.push(base)
        runtime = base
        if two_bases:
            runtime = f"{registry}/fa-images-test/runtime:1"
            client.images.get(bases.runtime).tag(runtime)
            client.images.push(runtime)
        entry = {"python": "3.11", "torch": "2.9.1", "cuda": "12.8", "flash_attn": VERSION, "archs": ["80"]}
        matrix = work / "matrix.yaml"
        matrix.write_text(
            yaml.safe_dump(
                {
                    "image": f"{registry}/fa-images-test/import",
                    "bases": {"devel": base, "runtime": runtime, "python": "system"},
                    "packages": engine_env.index_packages(index, sdists="sdists"),
                    "build": {"network": "host", "builder": "buildkit"},
                    "compat": "compat.yaml",
                    "entries": [entry],
                },
                sort_keys=False,
            )
        )
        path = f"{cli_dir}:{os.environ['PATH']}"
        env_a = engine.env(PYTHONPATH=str(Path.cwd()), XDG_CACHE_HOME=str(work / "cache-a"), PATH=path)
        build("host-a", work, env_a, matrix)
        with engine_env.empty_docker_engine() as host_b:
            env_b = host_b.env(PYTHONPATH=str(Path.cwd()), XDG_CACHE_HOME=str(work / "cache-b"), PATH=path)
            build("host-b", work, env_b, matrix)
            for what in (["images"], ["system", "df"]):
                print(subprocess.run([str(CLI), "-H", host_b.base_url, *what], capture_output=True, text=True).stdout)
        for ref in (f"{registry}/fa-images-test/import", base.rsplit(":", 1)[0], runtime.rsplit(":", 1)[0]):
            engine_env.remove_images(client, ref)
        client.api.prune_builds()


if __name__ == "__main__":
    main()

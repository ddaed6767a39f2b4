"""The loop of a scheduled run (`export github --schedule`), for real, on the build story's
first build (tests/engine/test_build_engine.py, whose ``project`` and ``first_build`` are the
run's): the team's index gains a torch release that the table of its fa-images does not know yet.

Last in the engine tier, where nothing else of the run is on disk: the release's own torch stage
(7 GB) and its push are the tier's largest at their time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import engine_env
import pytest
import toolchain
import yaml
from build_project import BUILDKIT_CLI, GOOD, REPO, entry_id
from packaging.version import Version

from fa_images.config import compat, compatgen

pytestmark = pytest.mark.engine


# torch 2.10.0 beside 2.9.1: its own wheel name (torch2.10), CUDA 12.8 by default as the stand-in
# base, and a build tag on the file pip downloads (torch-2.10.0-3-...).
NEW_TORCH = "2.10.0"
NEW_ID = f"fa{GOOD}-py3.11-torch{NEW_TORCH}-cu128"


def fa_images_before(root: Path, release: str) -> Path:
    """A copy of fa-images whose built-in table ends before torch ``release``, as a release of it
    made before that torch shipped (every release since is in today's table). Only
    config/compat.yaml differs: its builder, which the inputs digest holds, is these very bytes."""
    dest = root / f"fa-images-before-{release}"
    shutil.copytree(REPO / "fa_images", dest / "fa_images", ignore=shutil.ignore_patterns("__pycache__"))
    table = dest / "fa_images" / "config" / "compat.yaml"
    text = table.read_text()
    older = {v: facts for v, facts in yaml.safe_load(text)["torch"].items() if Version(v) < Version(release)}
    table.write_text(compatgen.splice(text, "torch", yaml.safe_dump({"torch": older}, sort_keys=False)))
    return dest


def libraries(torch: str, cuda: str) -> list[list[str]]:
    """The CUDA library layers of the built-in table's torch ``torch`` and CUDA ``cuda``."""
    variant = compat.load().torch[torch].variant(cuda)
    assert variant is not None
    return [list(layer) for layer in variant.libraries]


def resolved_flash_attn(tmp: Path, index: str, torch_index: str, torch: str) -> str:
    """The flash-attn that uv picks from ``index`` beside ``torch`` (reading each wheel's metadata
    only, through PEP 658 or a range request: nothing is installed)."""
    venv = tmp / f"venv-{torch}"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")} | {"UV_CACHE_DIR": str(tmp / "uv")}
    python = str(venv / "bin" / "python")
    uv = [shutil.which("uv") or "uv", "pip", "install", "--no-config", "--dry-run", "--python", python]
    proc = subprocess.run(
        [*uv, "--index-url", index, "--extra-index-url", torch_index, f"flash-attn=={GOOD}", f"torch=={torch}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (line,) = [line for line in proc.stderr.splitlines() if line.strip().startswith("+ flash-attn==")]
    return line.split("==", 1)[1]


def test_a_torch_release_the_index_gains_is_built_alone_and_served_beside_the_others(
    project, first_build, index_dir: Path, tmp_path: Path
):
    """The index gains torch 2.10.0; `compat refresh` reports it (exit 10); `plan` on a matrix that
    names torch by rule gains its entry; `build --push --published`, on an engine without the first
    build's image, builds that entry alone: the 2.9.1 one is found in the index and the registry.
    `dist site` then serves both wheels, and uv picks each by its torch pin. A later fa-images then
    compiles nothing: the new entry's image is made around the wheel the site serves."""
    _, entries = first_build
    good = entries[entry_id(GOOD)]
    older = fa_images_before(project.dir, NEW_TORCH)
    env = project.buildkit_env(PYTHONPATH=str(older))
    table = project.dir / "loop-compat.yaml"  # the team's table: the one its fa-images came with, and its own sdists
    pins = yaml.safe_load((project.dir / "compat.yaml").read_text())
    text = (older / "fa_images" / "config" / "compat.yaml").read_text()
    table.write_text(compatgen.splice(text, "flash_attn", yaml.safe_dump(pins, sort_keys=False)))
    matrix = project.dir / "loop.yaml"
    matrix.write_text(
        yaml.safe_dump(
            {
                "image": f"{project.registry}/fa-images-test/flash-attn",
                "bases": project.stock.bases(),
                "packages": project.stock.packages(),
                # BuildKit: the new entry's pushed images carry its build cache for the next runner
                # (the first build's entry, the SDK's, is current all the same: the builder is no
                # input).
                "build": {"network": "host", "builder": "buildkit"},
                "compat": table.name,
                "matrix": {
                    "python": ["3.11"],
                    "torch": ">=2.9.1",
                    "flash_attn": [GOOD],
                    "cuda": ["12.8"],
                    "archs": [["80"]],
                },
            },
            sort_keys=False,
        )
    )

    def planned() -> list[str]:
        proc = project.run("plan", "--matrix", matrix.name, "--json", env=env)
        assert proc.returncode == 0, proc.stderr
        return [e["id"] for e in json.loads(proc.stdout)]

    release = toolchain.torch_release(NEW_TORCH, "3.11")
    added = [index_dir / wheel.name for wheel in sorted(release.glob("*.whl"))]
    try:
        with engine_env.pypi_server([index_dir, project.dir / "sdists"]) as mirror:
            refresh = ("compat", "refresh", "--table", table.name, "--pypi", mirror, "--torch-index", mirror, "--json")
            first = project.run(*refresh, env=env)  # the table as the team's last run left it
            assert first.returncode in (0, 10), first.stdout + first.stderr
            assert planned() == [entry_id(GOOD)]
            for wheel, link in zip(sorted(release.glob("*.whl")), added, strict=True):
                os.link(wheel, link)
            gained = project.run(*refresh, env=env)
        assert gained.returncode == 10, gained.stdout + gained.stderr
        report = json.loads(gained.stdout)
        assert report["torch"] == {
            "added": [
                {
                    "version": NEW_TORCH,
                    "python": ["3.11"],
                    "default_cuda": "12.8",
                    # its CUDA libraries, read from its METADATA on the mirror, as from PyPI for the built-in table
                    "cuda": {"12.8": {"cxx11_abi": True, "libraries": libraries(NEW_TORCH, "12.8")}},
                }
            ],
            "removed": [],
            "updated": [],
        }
        assert report["flash_attn"] == {"added": [], "removed": [], "updated": []}
        assert planned() == [entry_id(GOOD), NEW_ID]

        # One web server, as GitHub's: the published dist/, the release's assets (the workflow
        # uploads there), the site; an index's links over http stay on its host.
        assets = project.dir / "release"
        assets.mkdir()
        # An engine without the first build's images, as a runner that starts empty: the torch
        # stage they stand on goes too (7 GB), before this build makes the release's.
        engine_env.remove_test_images(project.client, prune=True)
        with engine_env.serve_directory(project.dir) as web:
            url, assets_url, site_url = f"{web}dist/", f"{web}release/", f"{web}site/"
            args = ("--push", "--published", url, "--dist", "loop-dist", "--log-dir", "loop-logs", "--gpus", "none")
            started = time.monotonic()
            proc = project.run("build", "--matrix", matrix.name, *args, "--report", "loop.json", env=env)
            print(f"the loop's build: {time.monotonic() - started:.0f} s\n{proc.stderr[-3000:]}")
            assert proc.returncode == 0, proc.stderr[-3000:]
            built = {e["id"]: e for e in json.loads((project.dir / "loop.json").read_text())["entries"]}
            assert [i for i, e in built.items() if not e["up_to_date"]] == [NEW_ID]  # one build: the new entry
            assert built[entry_id(GOOD)]["pushed"] == good["pushed"]
            assert project.client.images.list(name=good["image"]) == [], "the 2.9.1 image was pulled"
            new = built[NEW_ID]
            assert (new["status"], new["check"], new["kernels"]) == ("ok", "passed", 1), new
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", new["pushed"] or ""), new
            (wheel,) = (project.dir / "loop-dist").glob("*.whl")
            assert "+cu128torch2.10cxx11abitrue-cp311-cp311-" in wheel.name

            # Published as the workflow does: the site lists the new wheel, linked to the release,
            # beside what the published index serves; the new wheel and its metadata are uploaded.
            site_args = ("--dist", "loop-dist", "--wheel-url", assets_url, "--published", url, "--out", "site")
            site = project.run("dist", "site", *site_args, env=env)
            assert site.returncode == 0, site.stderr
            for path in site.stdout.split():
                os.link(project.dir / path, assets / Path(path).name)
            assert sorted(p.name for p in assets.iterdir()) == [wheel.name, f"{wheel.name}.metadata"]
            torches = ("2.9.1", NEW_TORCH)
            picked = {t: resolved_flash_attn(tmp_path, f"{site_url}simple/", project.stock.index, t) for t in torches}
            assert picked == {"2.9.1": Path(good["wheel"]).name.split("-")[1], NEW_TORCH: wheel.name.split("-")[1]}

            # A later fa-images (its builder is an input of every entry): nothing is current, and
            # nothing compiles. The image is made around the wheel the site serves, fetched and
            # verified; the next site takes the new record and has nothing to upload. The new
            # entry only: BuildKit holds its torch stage, not the SDK's of the first build.
            with (older / "fa_images" / "builder" / "__init__.py").open("a") as later:
                later.write("# a later release\n")
            args = ("--push", "--published", site_url, "--dist", "later-dist", "--log-dir", "later-logs")
            later_run = project.run(
                "build", "--matrix", matrix.name, *args, "--only", NEW_ID, "--gpus", "none", "--report", "later.json",
                env=env,
            )  # fmt: skip
            assert later_run.returncode == 0, later_run.stderr[-3000:]
            rebuilt = json.loads((project.dir / "later.json").read_text())["entries"]
            assert [(e["status"], e["up_to_date"], e["prebuilt"], e["check"]) for e in rebuilt] == [
                ("ok", False, True, "passed")
            ]
            assert [e["wheel_sha256"] for e in rebuilt] == [new["wheel_sha256"]]
            for log in (Path(e["log"]).read_text() for e in rebuilt):  # BuildKit's steps: "[install 2/4] RUN …"
                assert "[install " in log and "[builder " not in log and "compiling flash-attn" not in log
            site_args = (
                "--dist",
                "later-dist",
                "--wheel-url",
                assets_url,
                "--published",
                site_url,
                "--out",
                "site-later",
            )
            again = project.run("dist", "site", *site_args, env=env)
            assert (again.returncode, again.stdout) == (0, ""), again.stderr
    finally:
        for link in added:
            link.unlink(missing_ok=True)
        ref = f"{project.registry}/fa-images-test/flash-attn:{NEW_ID}"
        for tag in (ref, f"{ref}-builder"):
            if project.client.images.list(name=tag):
                project.client.images.remove(tag)
        project.client.images.prune(filters={"dangling": True})
        project.client.api.prune_builds()  # BuildKit's copy of the release's torch stage


def test_a_new_runner_with_empty_storage_takes_the_compile_from_the_registrys_build_cache(project, tmp_path: Path):
    """A CI runner's first job, or a new build host: a second Docker Engine on an empty data root,
    with an empty compiler cache, pointed at the tests' registry, builds the entry that the loop's
    build (the test before) compiled and pushed through BuildKit, with the fa-images of that build.
    The pushed images carry their build cache inline (the builder image beside the image holds the
    compile's): BuildKit takes the torch stage and the compile from there. No torch is installed,
    no kernel compiled, and the wheel is the loop's, byte for byte."""
    report = project.dir / "loop.json"
    assert report.is_file(), "the loop's build (the test before this one) did not run"
    pushed = {e["id"]: e for e in json.loads(report.read_text())["entries"]}[NEW_ID]
    assert pushed["pushed"], "the loop's build did not push the new entry"
    fa_images = fa_images_before(tmp_path, NEW_TORCH)  # the builder's bytes as the loop's build had them
    # The registry as a runner pointed at the loop's entry needs it: that entry and its builder
    # image. The first build's images go, and their 4.4 GB with them, before the runner's pull.
    ref = f"{project.registry}/fa-images-test/flash-attn:{NEW_ID}"
    freed = engine_env.keep_only(project.registry, [ref, f"{ref}-builder"])
    print(f"the registry collected {freed / 1e9:.1f} GB that the loop's entry does not name")
    base = project.stock.base
    with engine_env.empty_docker_engine() as runner:
        assert runner.client.images.list(all=True) == []
        # The base only, as a runner's registry mirror would serve it; nothing built on it.
        docker = str(BUILDKIT_CLI)
        save = subprocess.Popen([docker, "-H", project.env["DOCKER_HOST"], "save", base], stdout=subprocess.PIPE)
        load = subprocess.run([docker, "-H", runner.base_url, "load"], stdin=save.stdout, capture_output=True)
        assert (save.wait(), load.returncode) == (0, 0), load.stderr
        env = project.buildkit_env(
            DOCKER_HOST=runner.base_url, PYTHONPATH=str(fa_images), XDG_CACHE_HOME=str(tmp_path / "cache-home")
        )
        args = ("--only", NEW_ID, "--push", "--gpus", "none", "--dist", str(tmp_path / "dist"))
        started = time.monotonic()
        proc = project.run(
            "build", "--matrix", "loop.yaml", *args, "--log-dir", str(tmp_path / "logs"),
            "--report", str(tmp_path / "runner.json"), env=env,
        )  # fmt: skip
        print(f"the new runner's build: {time.monotonic() - started:.0f} s\n{proc.stderr[-3000:]}")
        assert proc.returncode == 0, proc.stderr[-3000:]
    (entry,) = json.loads((tmp_path / "runner.json").read_text())["entries"]
    assert (entry["status"], entry["up_to_date"], entry["check"], entry["kernels"]) == ("ok", False, "passed", 0), entry
    log = Path(entry["log"]).read_text()
    assert "the compile step came from the build cache: 0 kernels compiled" in log, log[-3000:]
    assert "Collecting torch==" not in log, "the runner installed torch"
    assert entry["wheel_sha256"] == pushed["wheel_sha256"]

"""The runtime image and the builder stage, built for real on a Docker Engine, with the build
tools and flash-attn's runtime dependencies from a private index that wants a credential.

What a user gets: one clean venv (torch, flash-attn and its runtime dependencies) on the
runtime base, flash-attn in one layer above the torch stage; `pip check` passes; flash-attn's
common modules import (they need einops); nothing of the builder stage rides along; the image
is no larger than its parts; it runs as uid 1000 even where the base already has a user with
that uid (Ubuntu 24.04's `ubuntu`, as in the tests' stock base). The stock base is the devel
base too, so its compiler is the base's own: that a runtime base without one gets none is
tested on the two-base build of test_build_engine.py (the second Python).

The index: a real pypiserver with an htpasswd file serves the build tools and the runtime
dependencies only to ``fa:<token>``; the tests' open index serves torch, so the entry stands on
the torch stage every other module built. The token must appear in no rendered Dockerfile, build
context, log, report, image history, or layer above that torch stage (the layers below it are the
other modules', made without the token).

And what the builder stage can run: the real setup.py of flash-attn 2.5.9.post1 and 2.6.3,
which call `git submodule` unconditionally, run inside the builder image itself.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker.errors
import engine_env
import pytest
import toolchain
import yaml
from fixtures.tiny import make_tiny_sdist
from packaging.requirements import Requirement

from fa_images.builder import environment
from fa_images.builder.gpucheck import IMPORTED_MODULES
from fa_images.builder.source import obtain_sdist, sha256_of
from fa_images.config import compat

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]
VERSION = "2.8.3.dev4"
ENTRY = f"fa{VERSION}-py3.11-torch2.9.1-cu128"
IMAGE = "fa-images-test/runtime-image"
# flash-attn versions whose setup.py runs `git submodule` whatever the environment.
GIT_CALLING = ("2.5.9.post1", "2.6.3")
MAX_OVERHEAD = 1.02
BUILD_MEMORY = "4g"
COMPAT = compat.load()
# What the private index serves: every build tool and runtime dependency the compat table pins
# (a wheel's name starts with the distribution's name).
PRIVATE = {Requirement(pin).name.replace("-", "_") for pin in (*COMPAT.build_tools, *COMPAT.runtime_deps)}


_run = engine_env.run_in


@dataclass
class Built:
    client: docker.DockerClient
    entry: dict
    root: Path  # the project directory, on the host only
    stdout: str
    stderr: str
    private_engine: bool  # the tests' own dockerd, which listens on TCP too
    base: str  # the runtime base (the devel base too)
    token: str  # the private index's credential
    rendered: subprocess.CompletedProcess[str]  # `render` of the same matrix


def _private_index(root: Path, token: str) -> tuple[Path, Path]:
    """The wheels the private index serves (hard links into the wheelhouse) and its htpasswd."""
    from passlib.apache import HtpasswdFile

    private = root / "private"
    private.mkdir()
    for wheel in toolchain.torch_wheelhouse().glob("*.whl"):
        if wheel.name.split("-")[0] in PRIVATE:
            os.link(wheel, private / wheel.name)
    htpasswd = HtpasswdFile(str(root / "htpasswd"), new=True)
    htpasswd.set_password("fa", token)
    htpasswd.save()
    return private, root / "htpasswd"


@pytest.fixture(scope="module")
def built(tmp_path_factory, stock: engine_env.Stock):
    root = tmp_path_factory.mktemp("runtime-image")
    sdists = root / "sdists"
    sha = sha256_of(make_tiny_sdist(sdists, version=VERSION))
    (root / "compat.yaml").write_text(
        yaml.safe_dump({"flash_attn": {VERSION: {"sha256": sha, "cuda_archs_env": True}}})
    )
    engine, client = stock.engine, stock.engine.client
    token = "tok-" + secrets.token_hex(12)
    private, htpasswd = _private_index(root, token)
    with engine_env.pypi_server([private], htpasswd=htpasswd) as private_url:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(private_url + "ninja/", timeout=10)
        assert refused.value.code == 401, "the private index must refuse a request without the credential"
        matrix = {
            "image": IMAGE,
            "bases": stock.bases(),  # a runtime base where uid 1000 is taken, as on Ubuntu 24.04's CUDA images
            "packages": stock.packages(index=private_url.replace("http://", f"http://fa:{token}@")),
            # A limit below one nvcc job's 5 GiB: the compile must size itself to one job.
            "build": {"network": "host", "memory": BUILD_MEMORY},
            "compat": "compat.yaml",
            "entries": [{"python": "3.11", "torch": "2.9.1", "cuda": "12.8", "flash_attn": VERSION, "archs": ["80"]}],
        }
        (root / "matrix.yaml").write_text(yaml.safe_dump(matrix, sort_keys=False))
        # Over TCP, to an engine whose /tmp is not the host's: as a remote engine would be. The
        # build context is kept (in the project directory, TMPDIR) for the token search.
        env = engine.env(
            tcp=True, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1", XDG_CACHE_HOME=str(root / "cache"), TMPDIR=str(root)
        )

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            command = [sys.executable, "-m", "fa_images", *args]
            return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=3000)

        rendered = run("render", "--matrix", "matrix.yaml", "--out", "dockerfiles")
        assert rendered.returncode == 0, rendered.stderr
        proc = run("build", "--matrix", "matrix.yaml", "--report", "report.json", "--keep-work")
    print(proc.stderr[-6000:])
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads((root / "report.json").read_text())
    (entry,) = report["entries"]
    yield Built(
        client, entry, root, proc.stdout, proc.stderr, engine.managed, stock.base, token=token, rendered=rendered
    )


def test_runtime_image_passes_pip_check_and_imports_the_modules(built):
    client, entry = built.client, built.entry
    assert entry["status"] == "ok" and entry["check"] == "passed"
    code, out, err = _run(client, entry["image"], "pip check")
    assert code == 0 and "No broken requirements found" in out, out + err
    imports = "; ".join(f"import {m}" for m in IMPORTED_MODULES)
    code, out, err = _run(client, entry["image"], f"python -c '{imports}; import einops; print(einops.__version__)'")
    pinned = next(p for p in COMPAT.runtime_deps if p.startswith("einops=="))
    assert code == 0 and out.strip() == pinned.partition("==")[2], out + err
    # torch imports without a warning: the numpy of the image's Python is there (issue 30).
    numpy = next(p for p in COMPAT.runtime_deps_for("3.11") if p.startswith("numpy=="))  # the entry's Python
    probe = "import torch, numpy; print(numpy.__version__, torch.ones(2).numpy())"
    code, out, err = _run(client, entry["image"], f"python -W error -c '{probe}'")
    assert code == 0 and out.split()[0] == numpy.partition("==")[2] and "Warning" not in err, out + err
    code, out, err = _run(client, entry["image"], "python -m fa_images.builder check --import-only")
    assert code == 0 and "bert_padding, layers.rotary, modules.mha" in out, out


def _contains(chunks: Iterator[bytes], needle: bytes) -> bool:
    tail = b""
    for chunk in chunks:
        if needle in tail + chunk:
            return True
        tail = chunk[-len(needle) :]
    return False


def _layer_dirs(client, image: str, below: str) -> list[Path] | None:
    """The files of each layer of ``image`` above the image ``below`` (its base), where the engine
    keeps them as overlay2 dirs on this host; None where it does not (then the whole image is read)."""
    driver = client.images.get(image).attrs.get("GraphDriver") or {}
    if driver.get("Name") != "overlay2":
        return None
    data = driver["Data"]
    dirs = [Path(data["UpperDir"]), *(Path(p) for p in (data.get("LowerDir") or "").split(":") if p)]
    above = len(client.images.get(image).attrs["RootFS"]["Layers"]) - len(
        client.images.get(below).attrs["RootFS"]["Layers"]
    )
    return dirs[:above] if all(d.is_dir() for d in dirs) else None


def _holds(paths: list[Path], needle: bytes) -> list[Path]:
    return [
        p
        for d in paths
        for p in d.rglob("*")
        if p.is_file() and not p.is_symlink() and _contains(iter([p.read_bytes()]), needle)
    ]


def test_the_private_index_authenticates_and_its_token_leaks_nowhere(built, stock: engine_env.Stock):
    client, entry, root, token = built.client, built.entry, built.root, built.token
    dockerfile = (root / "dockerfiles" / f"{ENTRY}.Dockerfile").read_text()
    assert "--no-index --find-links /opt/fa-images/wheels/tools ninja==" in dockerfile
    assert f"RUN pip install --index-url {stock.index} torch==2.9.1\n" in dockerfile
    assert "fa:" not in dockerfile

    # The kept build context: the wheels fetched with the token, and no token.
    (context,) = root.glob("fa-images-context-*")
    assert sorted(p.name for p in (context / "inputs" / "wheels").iterdir()) == ["tools"]
    files = [p for p in root.rglob("*") if p.is_file() and p.parent.name in ("dockerfiles", "logs")]
    files += [p for p in context.rglob("*") if p.is_file()]
    files.append(root / "report.json")
    for path in files:
        assert token.encode() not in path.read_bytes(), f"the token leaked into {path}"
    assert token not in built.stdout + built.stderr + built.rendered.stdout + built.rendered.stderr

    builder = f"{entry['image']}-builder"
    for tag in (entry["image"], builder):
        history = client.api.history(tag)
        assert not any(token in (layer.get("CreatedBy") or "") for layer in history), tag
    # Every layer this build added above the shared torch stage, the runtime's and the
    # builder's (which stands on that stage: one base is devel and runtime here).
    runtime = _layer_dirs(client, entry["image"], entry["torch_stage"])
    builder_layers = _layer_dirs(client, builder, entry["torch_stage"])
    if runtime is None or builder_layers is None:  # not overlay2 on this host: the whole images
        for tag in (entry["image"], builder):
            assert not _contains(client.images.get(tag).save(chunk_size=1 << 22), token.encode()), tag
    else:
        assert len(runtime) == 1 and len(builder_layers) >= 5
        assert _holds(runtime + builder_layers, token.encode()) == []
        # The search can find what it looks for: the einops it installed is in the runtime layer.
        assert _holds(runtime, b"einops")


def test_nothing_of_the_builder_stage_rides_along(built):
    client, entry = built.client, built.entry
    code, out, err = _run(client, entry["image"], "command -v ninja; ls /opt/build-tools /opt/fa-images 2>&1")
    assert "ninja" not in out.split("ls:")[0] and "No such file" in out, out
    assert sorted(out.split("/opt/fa-images:")[1].split()) == ["fa_images"], out  # no sdists, no cache
    for module in ("ninja", "psutil", "wheel"):
        code, out, err = _run(client, entry["image"], f"python -c 'import {module}'")
        assert code != 0 and "ModuleNotFoundError" in err, (module, err)
    # The torch stage and one layer: nothing else between the base and the image.
    image, torch_stage = (
        client.images.get(ref).attrs["RootFS"]["Layers"] for ref in (entry["image"], entry["torch_stage"])
    )
    assert image[:-1] == torch_stage
    # torch is the torch stage's, untouched: same version and CUDA variant the entry asked for.
    code, out, err = _run(client, entry["image"], "python -c 'import torch; print(torch.__version__)'")
    assert out.strip() == "2.9.1+cu128", out + err


def test_runtime_image_is_no_larger_than_its_parts(built):
    client, entry = built.client, built.entry
    image = client.images.get(entry["image"])
    assert entry["image_size"] == image.attrs["Size"]  # what the summary and the report say
    base = client.images.get(built.base)
    code, out, err = _run(client, entry["image"], "du -sb /opt/venv /opt/fa-images")
    assert code == 0, out + err
    parts = {Path(line.split()[1]).name: int(line.split()[0]) for line in out.strip().splitlines()}
    expected = base.attrs["Size"] + sum(parts.values())
    ratio = image.attrs["Size"] / expected
    print(
        f"runtime image {image.attrs['Size'] / 1e6:.1f} MB; base {base.attrs['Size'] / 1e6:.1f} MB + venv "
        f"{parts['venv'] / 1e6:.1f} MB + fa-images {parts['fa-images'] / 1e6:.1f} MB = {expected / 1e6:.1f} MB; "
        f"ratio {ratio:.4f}"
    )
    assert ratio <= MAX_OVERHEAD
    # No layer holds a wheel that a later layer deletes.
    history = " ".join(h.get("CreatedBy", "") for h in image.history())
    assert ".whl" not in history


def test_runtime_image_runs_as_uid_1000_where_that_uid_exists(built):
    client, entry = built.client, built.entry
    image = client.images.get(entry["image"])
    assert image.attrs["Config"]["User"] == "1000:1000"
    code, out, err = _run(client, entry["image"], "id -un; touch /home/flash/ok && echo writable")
    assert code == 0 and out.split() == ["ubuntu", "writable"], out + err


@pytest.fixture(scope="module")
def git_calling_sdists(sdist_cache) -> dict[str, Path]:
    table = COMPAT.flash_attn
    out = {}
    for version in GIT_CALLING:
        path, _ = obtain_sdist(
            version=version,
            sdist=None,
            dest_dir=sdist_cache,
            sources_dir=sdist_cache,
            sha256=table[version].sha256,
        )
        out[version] = path
    return out


@pytest.mark.parametrize("version", GIT_CALLING)
def test_builder_stage_runs_setup_py_that_calls_git(built, git_calling_sdists, version):
    """The real setup.py, in the builder image, as the compile runs it (build tools on the path)."""
    client, entry = built.client, built.entry
    sdist = git_calling_sdists[version]
    builder = f"{entry['image']}-builder"
    unpack = f"cd /tmp && tar xzf /sdists/{sdist.name} && cd flash_attn-{version} && "
    run_setup = "FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE python setup.py --version"
    volumes = {str(sdist.parent): {"bind": "/sdists", "mode": "ro"}}
    code, out, err = _run(
        client,
        builder,
        unpack + f"PYTHONPATH=/opt/build-tools PATH=/opt/build-tools/bin:$PATH {run_setup}",
        volumes=volumes,
    )
    assert code == 0 and out.strip().splitlines()[-1] == version, out + err
    # The same command without git on the PATH dies as the issue reported: the check can fail.
    code, out, err = _run(
        client, builder, unpack + f"PYTHONPATH=/opt/build-tools PATH=/opt/venv/bin {run_setup}", volumes=volumes
    )
    assert code != 0 and "No such file or directory: 'git'" in err, err


def test_the_build_went_through_an_engine_that_does_not_share_the_hosts_files(built):
    if not built.private_engine:
        pytest.skip("the engine is not the tests' private one, which listens on TCP too")
    assert "engine: Docker Engine" in built.stderr and " at tcp://127.0.0.1:" in built.stderr
    # The project directory, full on the host, is empty as the engine sees it...
    assert (built.root / "matrix.yaml").is_file()
    volumes = {str(built.root): {"bind": "/project", "mode": "ro"}}
    code, out, err = _run(built.client, engine_env.RUNTIME_TAG, "ls -A /project | wc -l", volumes=volumes)
    assert code == 0 and out.strip() == "0", out + err
    # ...and still the build read its context and the wheel came back.
    wheel = Path(built.entry["wheel"])
    assert wheel.is_file() and wheel.is_relative_to(built.root)


def test_the_compile_was_sized_by_the_builds_memory_limit(built):
    line = next(x for x in built.stderr.splitlines() if "compiling flash-attn" in x)
    sized = re.search(r"MAX_JOBS=(\d+) .*min\((\d+) CPUs / 1, (\d+) GiB", line)
    assert sized, line
    jobs, cpus, gib = map(int, sized.groups())
    assert jobs == 1 and gib <= 4, line  # what the 4 GiB limit leaves, read from the build's cgroup
    # Without the limit, the same rule on this machine runs more jobs: the limit is what changed it.
    unlimited = environment.size_parallelism(targets=1, cpus=cpus)
    assert unlimited.max_jobs > 1, unlimited.reason


def test_no_container_is_left_behind(built):
    client = built.client
    try:
        leftovers = [
            c.name
            for c in client.containers.list(all=True, ignore_removed=True)
            if c.image.tags and IMAGE in c.image.tags[0]
        ]
    except docker.errors.NotFound:
        leftovers = []
    assert leftovers == []

"""Proof that tests/engine_env.py gives a real engine, base images and registries."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest
from engine_env import (
    BaseImages,
    EngineHandle,
    base_images,
    cuda_devel_standin,
    docker_engine,
    keep_only,
    local_registry,
    run_build,
    serve_directory,
    unreachable_registry,
)

pytestmark = pytest.mark.engine

PROBE = "fa_engine_probe"


@pytest.fixture(scope="module")
def engine() -> Iterator[EngineHandle]:
    with docker_engine() as handle:
        yield handle


@pytest.fixture(scope="module")
def bases(engine: EngineHandle) -> BaseImages:
    return base_images(engine.client)


@pytest.fixture(autouse=True)
def no_leftover_containers(engine: EngineHandle) -> Iterator[None]:
    """Each test must remove every container it (or a build) created."""
    before = {c.id for c in engine.client.containers.list(all=True, ignore_removed=True)}
    yield
    left = [c.name for c in engine.client.containers.list(all=True, ignore_removed=True) if c.id not in before]
    assert not left, f"containers left behind: {left}"


def run(client: docker.DockerClient, image: str, script: str) -> str:
    """Run ``bash -c script`` in a throwaway container; return its output."""
    output = client.containers.run(image, ["bash", "-c", script], remove=True, network_mode="none", stderr=True)
    return output.decode()


def make_wheel(directory: Path, version: str = "1.0") -> Path:
    """Write a minimal pure-Python wheel by hand: no network, no build backend."""
    dist_info = f"{PROBE}-{version}.dist-info"
    files = {
        f"{PROBE}/__init__.py": b"VALUE = 'probe-ok'\n",
        f"{dist_info}/METADATA": (b"Metadata-Version: 2.1\nName: fa-engine-probe\n" + f"Version: {version}\n".encode()),
        f"{dist_info}/WHEEL": (b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = directory / f"{PROBE}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return wheel


def test_base_images(engine: EngineHandle, bases: BaseImages) -> None:
    runtime = run(
        engine.client,
        bases.runtime,
        "python3 -c 'import ensurepip, venv, ssl; print(\"py-ok\")'; command -v g++ || echo no-gxx",
    )
    assert "py-ok" in runtime
    assert "no-gxx" in runtime
    devel = run(
        engine.client,
        bases.devel,
        "printf '#include <Python.h>\\nint probe() { return Py_IsInitialized(); }\\n' "
        "| g++ -x c++ -c - $(python3-config --includes) -o /tmp/probe.o"
        " && echo compiled",
    )
    assert "compiled" in devel
    # Called again, everything is already there.
    assert base_images(engine.client) == bases


def test_pip_from_served_wheel_then_push_and_pull(engine: EngineHandle, bases: BaseImages, tmp_path: Path) -> None:
    client = engine.client
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    make_wheel(wheels)
    with serve_directory(wheels) as index, local_registry() as registry:
        dockerfile = (
            f"FROM {bases.runtime}\n"
            "ENV PIP_DISABLE_PIP_VERSION_CHECK=1\n"
            "RUN python3 -m venv /opt/venv"
            " && /opt/venv/bin/pip install --no-cache-dir --no-index"
            f" --find-links {index} fa-engine-probe\n"
        )
        (tmp_path / "Dockerfile").write_text(dockerfile)
        local_tag = "fa-images-test/probe:latest"
        remote = f"{registry}/fa-images-test/probe"
        image_id = run_build(client, path=str(tmp_path), tag=local_tag, network_mode="host")
        try:
            out = client.containers.run(
                local_tag,
                ["/opt/venv/bin/python", "-c", f"import {PROBE}; print({PROBE}.VALUE)"],
                remove=True,
                network_mode="none",
            )
            assert out.decode().strip() == "probe-ok"

            client.images.get(local_tag).tag(remote, "1")
            pushed = list(client.api.push(remote, tag="1", stream=True, decode=True))
            assert not [p for p in pushed if "error" in p], pushed
            assert any("Digest" in p.get("aux", {}) for p in pushed), pushed[-3:]

            # Drop every tag, so the image's own layer really comes from the
            # registry (the base layer stays, shared with the runtime image).
            client.images.remove(f"{remote}:1")
            client.images.remove(local_tag)
            with pytest.raises(docker.errors.ImageNotFound):
                client.images.get(image_id)
            pulled = list(client.api.pull(remote, tag="1", stream=True, decode=True))
            assert not [p for p in pulled if "error" in p], pulled
            assert any(p.get("status") == "Pull complete" for p in pulled), pulled
            assert client.images.get(f"{remote}:1").id == image_id
        finally:
            for ref in (f"{remote}:1", local_tag):
                try:
                    client.images.remove(ref)
                except docker.errors.ImageNotFound:
                    pass


def test_keep_only_collects_every_other_tag_and_the_layers_only_it_named(
    engine: EngineHandle, bases: BaseImages, tmp_path: Path
) -> None:
    """What a finished story pushed leaves the registry; what is kept still pulls, its base layers
    (shared with the dropped image) included."""
    client = engine.client
    (tmp_path / "Dockerfile").write_text(f"FROM {bases.runtime}\nRUN head -c 4000000 /dev/urandom > /noise\n")
    local_tag = "fa-images-test/noise:latest"
    run_build(client, path=str(tmp_path), tag=local_tag, network_mode="none")
    with local_registry() as registry:
        dropped, kept = f"{registry}/fa-images-test/noise:1", f"{registry}/fa-images-test/base:1"
        try:
            for source, ref in ((local_tag, dropped), (bases.runtime, kept)):
                client.images.get(source).tag(ref)
                pushed = list(client.api.push(ref, stream=True, decode=True))
                assert not [p for p in pushed if "error" in p], pushed
                client.images.remove(ref)
            for other_spelling in (f"localhost:{registry.partition(':')[2]}/fa-images-test/base:1", kept[: -len(":1")]):
                with pytest.raises(ValueError, match=r"is not 127\.0\.0\.1"):  # it would keep nothing
                    keep_only(registry, [other_spelling])
            freed = keep_only(registry, [kept])
            assert freed >= 1_000_000, freed  # the noise layer, compressed: random bytes stay 4 MB
            assert not [p for p in client.api.pull(kept, stream=True, decode=True) if "error" in p]
            with pytest.raises(docker.errors.NotFound):
                client.images.pull(dropped)
        finally:
            for ref in (dropped, kept, local_tag):
                try:
                    client.images.remove(ref)
                except docker.errors.ImageNotFound:
                    pass


def test_push_to_unreachable_registry_reports_error(engine: EngineHandle, bases: BaseImages) -> None:
    client = engine.client
    remote = f"{unreachable_registry()}/fa-images-test/nowhere"
    client.images.get(bases.runtime).tag(remote, "1")
    try:
        pushed = list(client.api.push(remote, tag="1", stream=True, decode=True))
    finally:
        client.images.remove(f"{remote}:1")
    errors = [p["error"] for p in pushed if "error" in p]
    assert errors, pushed


def test_cuda_devel_standin(engine: EngineHandle, bases: BaseImages, tmp_path: Path) -> None:
    client = engine.client
    outside = tmp_path / "outside.h"
    outside.write_text("#define OUTSIDE 1\n")
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "targets/x86_64-linux/lib").mkdir(parents=True)
    (cuda / "include").mkdir()
    nvcc = cuda / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.8, V12.8.93'\n")
    nvcc.chmod(0o755)
    (cuda / "lib64").symlink_to("targets/x86_64-linux/lib")  # stays a symlink
    (cuda / "include" / "outside.h").symlink_to(outside)  # copied in
    libdevice = tmp_path / "nvvm" / "libdevice"
    libdevice.mkdir(parents=True)
    (libdevice / "libdevice.10.bc").write_bytes(b"BC")
    (cuda / "nvvm").symlink_to(tmp_path / "nvvm")  # a directory, copied in
    tag = "fa-images-test/cuda:standin-selftest"
    try:
        assert cuda_devel_standin(client, bases.devel, cuda, tag=tag) == tag
        first = client.images.get(tag).id
        out = run(
            client,
            tag,
            "nvcc --version; echo home=$CUDA_HOME; echo path=$PATH;"
            " echo ld=$LD_LIBRARY_PATH; readlink /usr/local/cuda/lib64;"
            " cat /usr/local/cuda/include/outside.h;"
            " test -f /usr/local/cuda/nvvm/libdevice/libdevice.10.bc && echo nvvm-ok",
        )
        assert "release 12.8" in out
        assert "home=/usr/local/cuda" in out
        assert "path=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:" in out
        assert "ld=/usr/local/nvidia/lib:/usr/local/nvidia/lib64" in out
        assert "targets/x86_64-linux/lib" in out
        assert "#define OUTSIDE 1" in out
        assert "nvvm-ok" in out
        # Unchanged inputs: no rebuild, same image.
        assert cuda_devel_standin(client, bases.devel, cuda, tag=tag) == tag
        assert client.images.get(tag).id == first
    finally:
        try:
            client.images.remove(tag)
        except docker.errors.ImageNotFound:
            pass

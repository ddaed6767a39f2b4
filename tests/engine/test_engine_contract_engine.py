"""The real engines keep the contract the fake keeps (tests/engine_contract.py): the tests' Docker
Engine and Podman (its Docker-compatible API, as fa-images talks to it), each with its Debian
runtime base and a registry of its own with no login. Seconds: a few short containers and one push
of a base whose layers the registry then holds."""

from __future__ import annotations

from collections.abc import Iterator

import docker.errors
import engine_env
import pytest
from engine_contract import CHECKS, EngineWorld

from fa_images.run.engine import DockerEngine

pytestmark = pytest.mark.engine


# Podman's half runs where Podman's module does (its group, the other pytest-xdist worker): that
# worker's queue is the shorter, and the two take Podman's service in turn anyway (one lock).
@pytest.fixture(scope="module", params=["docker", pytest.param("podman", marks=pytest.mark.xdist_group("podman"))])
def engine_and_registry(request: pytest.FixtureRequest) -> Iterator[tuple[engine_env.EngineHandle, str, str]]:
    started = engine_env.docker_engine() if request.param == "docker" else engine_env.podman_engine()
    with started as engine, engine_env.local_registry() as registry:
        yield engine, engine_env.base_images(engine.client).runtime, registry


@pytest.fixture
def world(engine_and_registry) -> Iterator[EngineWorld]:
    handle, base, registry = engine_and_registry
    client = handle.client

    def forget(ref: str) -> None:
        try:
            client.images.remove(ref)
        except docker.errors.ImageNotFound:
            pass

    made = EngineWorld(DockerEngine(client), base, registry, forget)
    yield made
    for name in made.kept:
        client.containers.get(name).remove(force=True)


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_the_real_engine_keeps_the_contract(world: EngineWorld, check) -> None:
    check(world)

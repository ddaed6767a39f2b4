"""Both real builders keep the contract the fake keeps (tests/builder_contract.py), on the tests'
engine and its Debian base: BuildKit through Debian's 20.10 docker CLI, and the docker SDK's
legacy builder. A few seconds each: the Dockerfile is a few echo lines on the shared base."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import build_project
import docker.errors
import engine_env
import pytest
from builder_contract import CHECKS, World

from fa_images.run import buildkit
from fa_images.run.engine import DockerEngine
from fa_images.run.sdk_builder import SdkBuilder

pytestmark = pytest.mark.engine


@pytest.fixture(params=["buildkit", "sdk"])
def world(request: pytest.FixtureRequest, stock: engine_env.Stock, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    client = stock.engine.client
    monkeypatch.setenv("DOCKER_HOST", stock.engine.base_url)  # the CLI's daemon is the SDK's
    if request.param == "buildkit":
        cli = buildkit.find_cli(str(build_project.BUILDKIT_CLI))
        assert isinstance(cli, buildkit.Cli), cli
        builder: buildkit.BuildKitBuilder | SdkBuilder = buildkit.BuildKitBuilder(cli)
    else:
        builder = SdkBuilder(DockerEngine(client))
    made: list[str] = []

    def holds(ref: str) -> bool:
        try:
            client.images.get(ref)
        except docker.errors.ImageNotFound:
            return False
        made.append(ref)
        return True

    def fail_cache(context: Path) -> None:
        (context / "cache-ok").unlink()  # its COPY then fails

    yield World(builder, stock.base, holds, fail_cache, network="host")
    for ref in made:
        client.images.remove(ref, force=True)


def test_debians_20_10_cli_has_buildkit_built_in() -> None:
    """The CLI .ci/setup installs, as the engine tier's BuildKit builds use it."""
    cli = buildkit.find_cli(str(build_project.BUILDKIT_CLI))
    assert isinstance(cli, buildkit.Cli), cli
    assert cli.argv == (str(build_project.BUILDKIT_CLI), "build") and cli.env == {"DOCKER_BUILDKIT": "1"}


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_a_real_builder_keeps_the_contract(world: World, tmp_path: Path, check) -> None:
    check(world, tmp_path)

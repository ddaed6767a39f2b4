"""The base-image preflight against a real engine: it tells present from missing, and pulls nothing."""

from __future__ import annotations

import engine_env
import pytest

from fa_images.run.engine import DockerEngine

pytestmark = pytest.mark.engine


def test_missing_images_names_only_what_the_engine_lacks() -> None:
    with engine_env.docker_engine() as engine:
        bases = engine_env.base_images(engine.client)
        absent = "fa-images-test/never-built:1"
        assert DockerEngine(engine.client).missing_images([bases.runtime, absent]) == [absent]
        assert not engine.client.images.list(name="fa-images-test/never-built"), "nothing may be pulled"

"""The fake builder keeps the contract of the real ones (tests/builder_contract.py; the real
builders run the same checks on the tests' engine: tests/engine/test_builder_contract_engine.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from builder_contract import CHECKS, World
from fakes import FakeBuilder, FakeEngine


@pytest.fixture(params=["buildkit", "sdk"])
def world(request: pytest.FixtureRequest) -> World:
    engine = FakeEngine()

    def fail_cache(_context: Path) -> None:
        engine.fail_cache_export = True

    return World(FakeBuilder(engine, request.param), "fake/base", lambda ref: ref in engine.labels, fail_cache)


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_the_fake_builder_keeps_the_contract(world: World, tmp_path: Path, check) -> None:
    check(world, tmp_path)

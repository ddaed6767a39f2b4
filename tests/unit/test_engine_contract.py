"""The fake engine keeps the contract of the real one (tests/engine_contract.py; the real engine
runs the same checks on the tests' engine: tests/engine/test_engine_contract_engine.py)."""

from __future__ import annotations

import pytest
from engine_contract import CHECKS, EngineWorld
from fakes import FakeEngine


@pytest.fixture
def world() -> EngineWorld:
    engine = FakeEngine()
    engine.held["fake/base"] = "sha256:" + "b" * 64

    def forget(ref: str) -> None:
        engine.forget(ref)

    def absent(ref: str) -> None:
        engine.missing.add(ref)
        engine.unpullable = engine.unpullable | {ref}

    return EngineWorld(engine, "fake/base", "127.0.0.1:5000", forget, absent)


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
def test_the_fake_engine_keeps_the_contract(world: EngineWorld, check) -> None:
    check(world)

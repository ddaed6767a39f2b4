"""What the engine tier leaves on the shared engine once every Docker module has run: ordered last
in the tier (tests/engine/conftest.py), after the new runner, so it checks the whole tier.

Cheap by design: the engine group's worker runs a test only once it holds the next one, so the
group's last test is the one that waits for the next group; ending on this check lets the new
runner start at once (tests/xdist_schedule.py)."""

from __future__ import annotations

import engine_env
import pytest

pytestmark = pytest.mark.engine


def test_no_module_left_a_container_on_the_shared_engine(stock: engine_env.Stock) -> None:
    assert stock.engine.client.containers.list(all=True, ignore_removed=True) == []

"""The unit tier's shared fixtures."""

from __future__ import annotations

import functools
import sys

import pytest

from fa_images.builder import environment

_probe_torch_once = functools.cache(environment.probe_torch)


@pytest.fixture(autouse=True)
def _own_cache_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's ~/.cache (sdists, compiler caches) is never read or written by a unit test."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache-home")))


@pytest.fixture(autouse=True)
def _torch_probed_once_per_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real torch probe imports torch in a child (~1.5 s); its answer for one interpreter
    cannot change within a run, so the unit tier asks each interpreter once."""
    monkeypatch.setattr(environment, "probe_torch", lambda python=sys.executable: _probe_torch_once(python))

"""The compile group's compiler cache on the host: carried into each build context, replaced
after each build, never an input and never a reason to fail. Against a fake engine; the real
round trip through an engine and sccache is in tests/engine/test_build_engine.py (the second Python)."""

from __future__ import annotations

import io
from pathlib import Path

import fakes
import pytest
from fakes import FakeEngine, accept_every_wheel

from fa_images import cli
from fa_images.outputs import group_cache
from fa_images.run.executor import Options
from fa_images.run.logger import Console


def build(matrix, engine: FakeEngine, tmp_path: Path, **options) -> tuple[list, str]:
    out = io.StringIO()
    opts = Options(dist=tmp_path / "dist", log_dir=tmp_path / "logs", **options)
    _, results = fakes.execute(matrix, engine, opts, Console(out))
    return results, out.getvalue()


@pytest.fixture(autouse=True)
def _wheels_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    accept_every_wheel(monkeypatch)


def test_the_tiny_matrix_is_one_group_of_two_pythons(tiny_matrix) -> None:
    assert [e.python for e in tiny_matrix.entries] == ["3.11", "3.12"]
    assert len({e.compile_group for e in tiny_matrix.entries}) == 1


def test_the_second_python_builds_with_the_cache_the_first_left(tiny_matrix, tmp_path: Path) -> None:
    first, second = (e.image for e in tiny_matrix.entries)
    group = tiny_matrix.entries[0].compile_group
    engine = FakeEngine()
    results, out = build(tiny_matrix, engine, tmp_path, compiler_cache=tmp_path / "cc")
    assert [r.status for r in results] == ["ok", "ok"]
    assert engine.cache_in_context[first] == {}
    # The first entry's cache stage, taken by its id from the one build that made it.
    made_by_first = f"sha256:{tiny_matrix.entries[0].id}-compiler-cache"
    assert engine.cache_in_context[second] == {"0/object": f"compiled in {made_by_first}"}
    assert [(r.kernels_from_cache, r.kernels) for r in results] == [(0, 4), (1, 4)]
    assert "kernels from the compiler cache: 1 of 4" in out
    # Replaced after each build: the host keeps the last one, and no staging dir.
    assert sorted(p.name for p in (tmp_path / "cc").iterdir()) == [group]
    assert (tmp_path / "cc" / group / "0" / "object").is_file()


def test_without_a_compiler_cache_nothing_is_carried_or_saved(tiny_matrix, tmp_path: Path) -> None:
    engine = FakeEngine()
    results, _ = build(tiny_matrix, engine, tmp_path, compiler_cache=None)
    assert [r.status for r in results] == ["ok", "ok"]
    assert not any(c[0] == "export_dir" for c in engine.calls)
    assert all(seen == {} for seen in engine.cache_in_context.values())


def test_a_cache_that_cannot_be_saved_fails_no_entry_and_keeps_the_old_one(tiny_matrix, tmp_path: Path) -> None:
    group = tiny_matrix.entries[0].compile_group
    old = tmp_path / "cc" / group / "a" / "object"
    old.parent.mkdir(parents=True)
    old.write_text("from an earlier run")
    engine = FakeEngine()
    engine.fail_cache_export = True
    results, out = build(tiny_matrix, engine, tmp_path, compiler_cache=tmp_path / "cc")
    assert [r.status for r in results] == ["ok", "ok"]
    assert f"compiler cache of {group} not saved: exporting the files of" in out
    assert old.read_text() == "from an earlier run"
    assert sorted(p.name for p in (tmp_path / "cc").iterdir()) == [group]
    # Both Pythons got the earlier run's cache.
    assert all(seen == {"a/object": "from an earlier run"} for seen in engine.cache_in_context.values())


def test_fill_links_or_copies_and_leaves_the_kept_cache_alone(tmp_path: Path) -> None:
    kept = tmp_path / "root" / "g" / "d" / "obj"
    kept.parent.mkdir(parents=True)
    kept.write_text("object")
    assert group_cache.fill(tmp_path / "root", "g", tmp_path / "ctx") == len("object")
    assert (tmp_path / "ctx" / "d" / "obj").read_text() == "object"
    assert group_cache.fill(tmp_path / "root", "other", tmp_path / "empty") == 0
    assert list((tmp_path / "empty").iterdir()) == []
    assert group_cache.fill(None, "g", tmp_path / "none") == 0


def test_the_cache_flags_exclude_each_other(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["build", "--compiler-cache", "x", "--no-compiler-cache"])
    assert exit_.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err

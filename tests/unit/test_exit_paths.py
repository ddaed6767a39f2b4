"""`fa-images build` leaves no temp state and says what happened, on every way out.

A fake engine stands in for the daemon (these are the fast tests of the exit paths); the
real engine runs the same executor in test_build_engine.py.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import fakes
import pytest
from fakes import FakeEngine, accept_every_wheel

from fa_images import cli


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temp dir the tool uses, empty and private to this test."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def run_build(monkeypatch, engine: FakeEngine, *args: str) -> int:
    fakes.use_engine(monkeypatch, engine)
    return cli.main(["build", "--matrix", "matrix.yaml", "--gpus", "none", *args])


@pytest.mark.parametrize(
    ("engine", "code"),
    [(FakeEngine(), 0), (FakeEngine(fail_build={"py3.11"}), 1), (FakeEngine(interrupt_on="py3.12"), 130)],
    ids=["success", "a failed entry", "ctrl-c"],
)
def test_build_contexts_are_removed_on_every_way_out(
    tiny_matrix, private_tmp: Path, monkeypatch, engine: FakeEngine, code: int
) -> None:
    accept_every_wheel(monkeypatch)
    assert run_build(monkeypatch, engine) == code
    assert [c for c in engine.calls if c[0] == "build"], "the build really ran"
    assert list(private_tmp.iterdir()) == []


def test_keep_work_keeps_the_context_and_logs_where(tiny_matrix, private_tmp: Path, monkeypatch, capsys) -> None:
    accept_every_wheel(monkeypatch)
    assert run_build(monkeypatch, FakeEngine(), "--keep-work", "--only", "fa2.8.3-py3.12-torch2.9.1-cu128") == 0
    (kept,) = private_tmp.iterdir()
    assert (kept / "Dockerfile").is_file() and f"kept the work dir for debugging: {kept}" in capsys.readouterr().err


def test_the_report_is_written_when_stderr_is_a_closed_pipe(tiny_matrix, monkeypatch) -> None:
    accept_every_wheel(monkeypatch)
    read, write = os.pipe()
    os.close(read)  # `fa-images build ... 2>&1 | head -1`, after head has exited
    closed = os.fdopen(write, "w")
    monkeypatch.setattr("sys.stderr", closed)
    code = run_build(monkeypatch, FakeEngine(fail_build={"py3.11"}), "--report", "report.json")
    assert code == 1  # the real outcome: one entry failed
    report = json.loads(Path("report.json").read_text())
    assert [e["status"] for e in report["entries"]] == ["failed", "ok"]

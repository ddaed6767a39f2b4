"""bench/suite_timeline.py: the controller records each phase a worker reports, and the summary
reads a recorded run back (run 48's, a few of its lines)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import suite_timeline

RECORDED = """\
{"worker": "gw0", "id": "tests/engine/test_engine_hygiene.py::test_the_next_run_clears_what_a_killed_run_left@engine", "when": "setup", "start": 1795898112.3410938, "stop": 1795898112.3429117}
{"worker": "gw0", "id": "tests/engine/test_engine_hygiene.py::test_the_next_run_clears_what_a_killed_run_left@engine", "when": "call", "start": 1795898112.3431375, "stop": 1795898189.1400383}
{"worker": "gw1", "id": "tests/engine/test_bake_engine.py::test_bake_builds_the_image_the_builder_and_the_wheel_of_the_export@bake", "when": "setup", "start": 1795898112.3304417, "stop": 1795898496.7624476}
{"worker": "gw1", "id": "tests/engine/test_bake_engine.py::test_bake_builds_the_image_the_builder_and_the_wheel_of_the_export@bake", "when": "call", "start": 1795898496.7662, "stop": 1795898496.7792532}
{"worker": "gw1", "id": "tests/engine/test_podman_engine.py::test_no_container_is_left_behind_on_podman@podman", "when": "call", "start": 1795898908.1508632, "stop": 1795898908.154844}
{"worker": "gw1", "id": "tests/engine/test_podman_engine.py::test_no_container_is_left_behind_on_podman@podman", "when": "teardown", "start": 1795898908.1554883, "stop": 1795898921.0387292}
"""  # noqa: E501


def test_the_summary_gives_each_workers_modules_in_order_and_its_idle_end() -> None:
    text = suite_timeline.summary([json.loads(line) for line in RECORDED.splitlines()])
    assert text.splitlines() == [
        "run: 809 s from the first test to the last",
        "",
        "gw0: busy until 77 s, idle for the last 732 s",
        "       0     77    76.8  tests/engine/test_engine_hygiene.py",
        "",
        "gw1: busy until 809 s, idle for the last 0 s",
        "       0    384   384.4  tests/engine/test_bake_engine.py",
        "     796    809    12.9  tests/engine/test_podman_engine.py",
    ]


def _report(start: float) -> pytest.TestReport:
    return pytest.TestReport("tests/unit/test_x.py::test_y", ("tests/unit/test_x.py", 1, "test_y"), {}, "passed", None,
                      "call", start=start, stop=start + 2.5)  # fmt: skip


def test_the_controller_writes_a_line_per_phase_and_a_worker_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "timeline.jsonl"
    monkeypatch.setenv(suite_timeline.VARIABLE, str(record))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    report = _report(100.0)
    report.node = SimpleNamespace(gateway=SimpleNamespace(id="gw1"))  # type: ignore[attr-defined]  # xdist adds it
    suite_timeline.pytest_runtest_logreport(report)
    suite_timeline.pytest_runtest_logreport(_report(200.0))  # no worker: a run without xdist
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    suite_timeline.pytest_runtest_logreport(_report(300.0))  # the worker's own hook call
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert [(r["worker"], r["start"], r["stop"], r["when"]) for r in lines] == [
        ("gw1", 100.0, 102.5, "call"),
        ("main", 200.0, 202.5, "call"),
    ]


def test_without_the_variable_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(suite_timeline.VARIABLE, raising=False)
    monkeypatch.chdir(tmp_path)
    suite_timeline.pytest_runtest_logreport(_report(1.0))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json\n",
        '{"worker": "gw0"}\n',
        "[1, 2]\n",
        '{"worker": "gw0", "id": 1, "when": "call", "start": 0, "stop": 2}\n',
    ],
)
def test_a_file_that_is_not_a_timeline_is_one_error_line(
    text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "timeline.jsonl"
    path.write_text(text)
    assert suite_timeline.main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: not a timeline") and err.count("\n") == 1, err


@pytest.mark.parametrize("name", ["gone.jsonl", "fifo", "directory"])
def test_what_is_not_a_regular_file_is_one_error_line(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if name == "fifo":
        os.mkfifo(tmp_path / name)  # read, it would wait for a writer forever
    elif name == "directory":
        (tmp_path / name).mkdir()
    assert suite_timeline.main([str(tmp_path / name)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err


def test_an_endless_file_is_refused_before_it_is_read(capsys: pytest.CaptureFixture[str]) -> None:
    assert suite_timeline.main(["/dev/zero"]) == 2
    assert "not a regular file" in capsys.readouterr().err

"""The base images before any build: pulled as the policy says, with progress, or refused with
both ways to provide them; then checked for the Python and nvcc the build needs.

A fake engine stands in for the daemon (the fast tests of each path); the real pull from a
registry, and the real preflight, run in tests/engine/test_pull_engine.py.
"""

from __future__ import annotations

import argparse
import errno
import json
from pathlib import Path

import fakes
import pytest
from fakes import FakeEngine, accept_every_wheel

from fa_images import cli
from fa_images.builder import cli as builder_cli
from fa_images.errors import EngineUnavailable, EnvironmentProblem, UsageError
from fa_images.run.engine import DockerEngine

DEVEL = "nvidia/cuda:12.8.1-devel-ubuntu22.04"
RUNTIME = "nvidia/cuda:12.8.1-base-ubuntu22.04"


def run_build(monkeypatch, engine: FakeEngine, *args: str) -> int:
    fakes.use_engine(monkeypatch, engine)
    return cli.main(["build", "--matrix", "matrix.yaml", "--gpus", "none", *args])


def add_to_matrix(text: str) -> None:
    path = Path("matrix.yaml")
    path.write_text(path.read_text() + text)


def builds(engine: FakeEngine) -> list[tuple]:
    return [c for c in engine.calls if c[0] == "build"]


def test_missing_bases_are_pulled_with_progress_before_any_build(tiny_matrix, monkeypatch, capsys) -> None:
    accept_every_wheel(monkeypatch)
    engine = FakeEngine(missing=frozenset({DEVEL, RUNTIME}))
    assert run_build(monkeypatch, engine) == 0
    names = [c[0] for c in engine.calls]
    assert names.index("pull") < names.index("build")
    assert [c[1] for c in engine.calls if c[0] == "pull"] == sorted([DEVEL, RUNTIME])
    err = capsys.readouterr().err
    assert f"pull {DEVEL} · 0123456789ab · Downloading 10.0/20.0 MB" in err  # a line per layer's status
    assert f"✓ pull {DEVEL} (" in err and f"✓ pull {RUNTIME} (" in err  # a line per image
    assert "pulled 2 base images in " in err and "(--pull missing)" in err


def test_bases_the_engine_holds_are_not_pulled_unless_always(tiny_matrix, monkeypatch, capsys) -> None:
    accept_every_wheel(monkeypatch)
    held = FakeEngine()
    assert run_build(monkeypatch, held) == 0
    assert not [c for c in held.calls if c[0] == "pull"]
    again = FakeEngine()
    assert run_build(monkeypatch, again, "--pull", "always") == 0
    assert [c[1] for c in again.calls if c[0] == "pull"] == sorted([DEVEL, RUNTIME])


def test_pull_never_refuses_in_an_instant_with_both_ways(tiny_matrix, monkeypatch, capsys) -> None:
    engine = FakeEngine(missing=frozenset({DEVEL, RUNTIME}))
    assert run_build(monkeypatch, engine, "--pull", "never") == 3
    assert not [c for c in engine.calls if c[0] == "pull"] and not builds(engine)  # in an instant: nothing asked
    lines = capsys.readouterr().err.splitlines()
    assert lines[:2] == ["engine: fake engine", "builder: a fake builder of the buildkit form (auto)"]
    assert lines[2].startswith("signing: none: nothing is signed")
    lines = lines[:2] + lines[3:]
    assert lines[2] == f"error: 2 base images not in the engine: {RUNTIME}, {DEVEL}; --pull never forbids pulling"
    hint = lines[3]
    assert f"docker pull {RUNTIME} && docker pull {DEVEL}" in hint  # every image, not only the first
    assert "docker load -i" in hint and "bases.devel / bases.runtime" in hint and "local tag" in hint
    assert [c[0] for c in engine.calls] == ["missing_images"]  # asked, never built or pulled
    assert not Path("dist").exists()


def test_the_matrix_can_forbid_pulls_and_the_flag_wins(tiny_matrix, monkeypatch, capsys) -> None:
    add_to_matrix("build: {pull: never}\n")
    assert run_build(monkeypatch, FakeEngine(missing=frozenset({DEVEL}))) == 3
    assert "--pull never forbids pulling" in capsys.readouterr().err
    accept_every_wheel(monkeypatch)
    engine = FakeEngine(missing=frozenset({DEVEL}))
    assert run_build(monkeypatch, engine, "--pull", "missing") == 0
    assert ("pull", DEVEL) in engine.calls


def test_a_pull_that_fails_is_one_error_naming_the_image(tiny_matrix, monkeypatch, capsys) -> None:
    engine = FakeEngine(missing=frozenset({DEVEL, RUNTIME}), unpullable=frozenset({DEVEL}))
    assert run_build(monkeypatch, engine) == 3
    err = capsys.readouterr().err
    assert f"error: cannot pull base image {DEVEL}: pull of {DEVEL} failed: manifest unknown" in err
    assert "docker.io is reachable" in err and "docker load -i" in err
    hint = err.split("error: cannot pull", 1)[1].splitlines()[1]
    assert "hint:" in hint and "--pull" not in hint  # what just failed is not offered as the fix
    assert not builds(engine) and "Traceback" not in err


def test_every_failed_pull_is_named_in_one_error_with_a_hint_for_the_policy(tiny_matrix, monkeypatch, capsys) -> None:
    """Issue 30: offline, `--pull missing` named only the first base and offered `--pull missing`."""
    for flag in ("missing", "always"):
        engine = FakeEngine(missing=frozenset({DEVEL, RUNTIME}), unpullable=frozenset({DEVEL, RUNTIME}))
        assert run_build(monkeypatch, engine, "--pull", flag) == 3
        lines = capsys.readouterr().err.splitlines()
        assert sorted(c[1] for c in engine.calls if c[0] == "pull") == sorted([DEVEL, RUNTIME])  # each one tried
        (error,) = [line for line in lines if line.startswith("error:")]
        assert error == f"error: cannot pull 2 base images ({RUNTIME}, {DEVEL}): manifest unknown"  # one cause, once
        hint = lines[lines.index(error) + 1]
        assert "check that docker.io is reachable from the engine and has these tags" in hint
        assert "--pull missing" not in hint and "docker load -i" in hint
        assert not builds(engine)


def test_preflight_refuses_a_base_without_the_python_asked_for(tiny_matrix, monkeypatch, capsys) -> None:
    add_to_matrix("bases: {python: system}\n")
    engine = FakeEngine(lacking={RUNTIME: {"python3.12"}})
    assert run_build(monkeypatch, engine) == 3
    err = capsys.readouterr().err
    assert f"error: base image {RUNTIME} has no python3.12 on its PATH, which bases.python: system needs" in err, err
    assert "set bases.python: uv" in err
    assert not builds(engine)
    assert ("probe", DEVEL) in engine.calls and ("probe", RUNTIME) in engine.calls


def test_preflight_refuses_a_devel_base_without_nvcc_or_of_another_major(tiny_matrix, monkeypatch, capsys) -> None:
    engine = FakeEngine(lacking={DEVEL: {"nvcc"}})
    assert run_build(monkeypatch, engine) == 3
    err = capsys.readouterr().err
    assert f"error: base image {DEVEL} has no nvcc" in err and "the compile needs CUDA 12.8" in err
    assert "point bases.devel at a CUDA devel image" in err and not builds(engine)
    other = FakeEngine()
    other.nvcc = "13.0"
    assert run_build(monkeypatch, other) == 3
    assert "has nvcc 13.0, but the entries need CUDA 12.8 (another major version)" in capsys.readouterr().err


def test_preflight_names_what_it_found(tiny_matrix, monkeypatch, capsys) -> None:
    accept_every_wheel(monkeypatch)
    add_to_matrix("bases: {python: system}\n")
    engine = FakeEngine()
    engine.nvcc = "12.4"  # another minor of the same major builds: named, not refused
    assert run_build(monkeypatch, engine) == 0
    err = capsys.readouterr().err
    assert f"✓ preflight {DEVEL} (" in err
    assert "python3.11 /usr/bin/python3.11; python3.12 /usr/bin/python3.12; nvcc 12.4" in err
    assert "(the entries name CUDA 12.8: same major)" in err
    assert f"✓ preflight {RUNTIME} (" in err


def test_the_report_is_written_when_the_bases_stop_the_run(tiny_matrix, monkeypatch, capsys) -> None:
    """Issue 30: `--report` was written on exit 1 but not on this exit 3; it records the failure."""
    engine = FakeEngine(missing=frozenset({DEVEL, RUNTIME}))
    assert run_build(monkeypatch, engine, "--pull", "never", "--report", "report.json") == 3
    report = json.loads(Path("report.json").read_text())
    assert (report["ok"], report["exit_code"], report["engine"], report["entries"]) == (False, 3, "fake engine", [])
    assert report["error"].startswith(f"2 base images not in the engine: {RUNTIME}, {DEVEL}; --pull never")
    assert report["not_run"] == [e.id for e in tiny_matrix.entries]


def test_the_report_is_written_when_no_engine_answers(tiny_matrix, monkeypatch, capsys) -> None:
    def no_engine(cls):
        raise EngineUnavailable("cannot reach the container engine", hint="start Docker")

    monkeypatch.setattr(DockerEngine, "from_env", classmethod(no_engine))
    assert cli.main(["build", "--gpus", "none", "--report", "report.json"]) == 7
    report = json.loads(Path("report.json").read_text())
    assert (report["ok"], report["exit_code"], report["engine"]) == (False, 7, None)
    assert report["error"] == "cannot reach the container engine\n  hint: start Docker"


def test_the_report_of_a_good_run_says_exit_0(tiny_matrix, monkeypatch) -> None:
    accept_every_wheel(monkeypatch)
    assert run_build(monkeypatch, FakeEngine(), "--report", "report.json") == 0
    report = json.loads(Path("report.json").read_text())
    assert (report["ok"], report["exit_code"], report["error"], report["not_run"]) == (True, 0, None, [])
    assert [e["status"] for e in report["entries"]] == ["ok", "ok"]


@pytest.mark.parametrize(
    "exc",
    [
        EnvironmentProblem("no room"),
        UsageError("bad flag"),
        KeyboardInterrupt(),
        OSError(errno.ENOSPC, "No space left on device"),
        OSError(errno.EISDIR, "Is a directory"),
        ValueError("bad value"),
        KeyError("a bug"),
        SystemExit(143),
    ],
)
def test_the_reports_exit_code_is_the_commands(exc: BaseException, capsys) -> None:
    def raise_it(_args):
        raise exc

    code: object
    try:
        code = builder_cli.run_command(argparse.Namespace(func=raise_it))
    except SystemExit as exited:
        code = exited.code
    assert builder_cli.exit_code_of(exc) == code


def test_pull_failures_are_one_line_per_cause_with_the_images_it_hit() -> None:
    """Issue 43: four bases that fail for one DNS reason gave one line repeating the cause four times."""
    from fa_images.run import bases

    dns = "Get https://{}/v2/: dial tcp: lookup nvcr.io: no such host"
    refs = [f"nvcr.io/nvidia/cuda:12.{m}.1-devel" for m in (4, 6, 8, 9)]
    failed = {ref: f"pull of {ref} failed: " + dns.format("nvcr.io") for ref in refs}
    failed["docker.io/x:1"] = "pull of docker.io/x:1 failed: manifest for docker.io/x:1 not found"
    message = bases.provide_failures_message(failed, "base image")
    assert message.splitlines() == [
        "cannot pull 5 base images, for 2 causes:",
        f"  {', '.join(refs)}: " + dns.format("nvcr.io"),
        "  docker.io/x:1: manifest for IMAGE not found",
    ]
    assert message.count("no such host") == 1

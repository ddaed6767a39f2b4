"""`build --dry-run` prints what `build` then does, for every flag that changes the plan.

Each flag set goes through `build --dry-run --json` and through `build` on the fake engine and
builder (held to the real builders' contract: tests/builder_contract.py); the builds, tags, files,
checks and pushes the fake saw must be the ones the dry run listed, in the same order.
"""

from __future__ import annotations

import json
from pathlib import Path

import fakes
import pytest
from test_prebuilt import LABEL, wheel
from test_up_to_date import OnePerPython, _wheels_accepted  # noqa: F401 (autouse: wheels pass with their sha256)

from fa_images import cli

ENTRY = "fa2.8.3-py3.12-torch2.9.1-cu128"
WHEELS = "given-wheels"
PUBLISHED = "published-dist"


def planned(plans: list[dict]) -> list[tuple]:
    """What the dry run says each entry's run does, as the fake records it."""
    said: list[tuple] = []
    for p in plans:
        said += [("before", t["stage"], "anew" if t["anew"] else "cached") for t in p["before"]]
        said.append(("build", p["build"]["stage"], p["build"]["tag"]))
        said += [("tag", t["tag"]) if t["tag"] else ("files", t["stage"]) for t in p["from_stages"]]
        said += [("run", tuple(c["command"])) for c in p["checks"]]
        said += [("push", ref) for ref in p["push"]]
    return said


def done(calls: list[tuple]) -> list[tuple]:
    """What the fake engine and builder were asked to do, in order (lookups and pulls aside)."""
    kinds = {
        "before": lambda c: c,
        "build": lambda c: c,
        "tag": lambda c: ("tag", c[2]),
        "export": lambda c: ("files", "wheel"),
        "export_dir": lambda c: ("files", "compiler-cache"),
        "run": lambda c: ("run", c[2]),
        "push": lambda c: ("push", c[1]),
    }
    return [kinds[c[0]](c) for c in calls if c[0] in kinds]


@pytest.fixture
def around(tiny_matrix, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """What --published takes, a first run's dist/ pushed to the fake's registry, and --wheels."""
    first = fakes.FakeEngine()
    fakes.use_engine(monkeypatch, first, OnePerPython)
    assert cli.main(["build", "--push", "--dist", PUBLISHED, "--gpus", "none"]) == 0
    for python in ("311", "312"):  # wheels pip would read, as --wheels checks before any engine
        wheel(tmp_path / WHEELS, f"flash_attn-2.8.3+{LABEL}-cp{python}-cp{python}-linux_x86_64.whl")
    capsys.readouterr()


@pytest.mark.parametrize(
    "flags",
    [
        [],
        ["--push"],
        ["--no-compiler-cache", "--push"],
        ["--builder", "sdk", "--push"],
        ["--builder", "buildkit", "--no-check"],
        ["--builder", "auto", "--gpus", "none"],
        ["--only", ENTRY, "--push"],
        ["--wheels", WHEELS, "--push"],
        ["--wheels", WHEELS, "--builder", "sdk"],
        ["--published", PUBLISHED, "--push"],
        ["--published", PUBLISHED, "--no-compiler-cache", "--only", ENTRY],
    ],
    ids=" ".join,
)
def test_the_dry_run_lists_what_the_build_does(around, monkeypatch: pytest.MonkeyPatch, capsys, flags) -> None:
    assert cli.main(["build", "--dry-run", "--json", *flags]) == 0
    plans = json.loads(capsys.readouterr().out)
    # A new host: the bases are other images (so nothing is up to date), the registry is shared.
    engine = fakes.FakeEngine(gpu=True)
    engine.held = {ref: f"sha256:another-{ref}" for p in plans for ref in p["bases"]}
    fakes.use_engine(monkeypatch, engine, OnePerPython)
    assert cli.main(["build", "--report", "report.json", *flags]) == 0, capsys.readouterr().err
    assert done(engine.calls) == planned(plans)
    report = json.loads(Path("report.json").read_text())
    assert [e["id"] for e in report["entries"]] == [p["id"] for p in plans]
    assert all(e["status"] == "ok" for e in report["entries"])


def test_every_flag_set_changes_the_plan(around, capsys) -> None:
    """The table above is no table of one plan: each of its flags changes what the dry run says."""
    seen = set()
    for flags in ([], ["--no-compiler-cache"], ["--builder", "sdk"], ["--wheels", WHEELS], ["--published", PUBLISHED]):
        assert cli.main(["build", "--dry-run", "--json", *flags]) == 0
        seen.add(capsys.readouterr().out)
    assert len(seen) == 5


def test_builds_defaults_live_in_its_typed_arguments_only() -> None:
    """Issue 49: a flag not given stays out of the parsed namespace, so BuildArgs's default is the
    one that applies; the parser's help reads it from there."""
    from dataclasses import fields

    from fa_images import cli
    from fa_images.run.build_args import BuildArgs

    parsed = vars(cli.build_parser().parse_args(["build"]))
    assert not {f.name for f in fields(BuildArgs)} & set(parsed)
    assert BuildArgs.of(parsed) == BuildArgs()
    given = vars(cli.build_parser().parse_args(["build", "--dist", "out", "--gpus", "none", "--no-check"]))
    assert BuildArgs.of(given) == BuildArgs(dist=Path("out"), gpus="none", check=False)

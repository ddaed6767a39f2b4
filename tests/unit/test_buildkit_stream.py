"""BuildKit's plain progress, as the 20.10 CLI printed it (tests/fixtures/buildkit: two real runs of
one Dockerfile, a failed RUN and a build the cache answered), read into steps, lines and failures.
The real builds are in tests/engine/test_build_engine.py."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from fa_images.run import buildkit
from fa_images.run.image_builder import BuildProgress

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "buildkit"


def read(name: str) -> tuple[buildkit._Stream, list[str], list[BuildProgress]]:
    stream, lines, steps = buildkit._Stream(), [], []
    for line in buildkit._lines(iter((FIXTURES / name).read_text().splitlines(keepends=True))):
        buildkit._read(line, stream, lines.append, steps.append)
    return stream, lines, steps


def test_a_failed_run_is_one_line_with_its_stage_step_exit_code_and_the_cause() -> None:
    stream, lines, steps = read("failed.txt")
    failure = buildkit._failure(stream, 1)
    assert str(failure).startswith("builder step 2/2 (RUN --mount=type=bind,from=torch,source=/opt/venv,")
    assert str(failure).endswith("exited with 3: fake line")
    assert "error: fake line" in failure.lines
    assert [(s.stage, s.step, s.total) for s in steps] == [("torch", 1, 2), ("torch", 2, 2), ("builder", 2, 2)]
    assert "venv" in lines and "error: fake line" in lines  # the RUN's own output, without BuildKit's prefix


def test_stages_the_cache_answered_whole() -> None:
    stream, _, _ = read("cached.txt")
    assert {"torch", "builder", "wheel", "runtime"} <= stream.cached_stages()
    failed, _, _ = read("failed.txt")
    assert "builder" not in failed.cached_stages() and "torch" in failed.cached_stages()


def test_a_failure_outside_any_step_names_the_clis_last_error() -> None:
    stream = buildkit._Stream()
    for line in ["#1 [internal] load build definition from Dockerfile", "error: failed to solve: no such stage"]:
        buildkit._read(line, stream, lambda _: None, lambda _: None)
    assert str(buildkit._failure(stream, 1)) == (
        "the build failed (the CLI exited with 1): error: failed to solve: no such stage"
    )


def test_hostile_output_is_escaped_and_bounded() -> None:
    raw = "#7 0.1 \x1b]0;title\x07 " + "x" * 100_000 + "\n"
    (line,) = buildkit._lines(iter([raw]))
    assert "\x1b" not in line and "\x07" not in line
    assert len(line) < 2 * buildkit.MAX_LINE


def test_the_local_output_keeps_no_link(tmp_path: Path) -> None:
    (tmp_path / "w.whl").write_bytes(b"w")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "f").write_text("f")
    (tmp_path / "link").symlink_to("/etc/passwd")
    (tmp_path / "dirlink").symlink_to(tmp_path / "sub")
    import os

    os.mkfifo(tmp_path / "fifo")
    buildkit._keep_files_and_dirs(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sub", "w.whl"]
    assert (tmp_path / "sub" / "f").read_text() == "f"


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@pytest.mark.parametrize(
    ("version", "found"),
    [("28.2.2", "has no buildx plugin, which its BuildKit needs"), ("nonsense", "does not answer `docker version`")],
)
def test_a_cli_without_buildkit_says_why(tmp_path: Path, version: str, found: str) -> None:
    # An error path, with a stand-in CLI: buildx missing, and the version it reports.
    docker = _script(tmp_path / "docker", f'[ "$1" = buildx ] && exit 1\necho {version}\n')
    said = buildkit.find_cli(docker)
    assert isinstance(said, str) and found in said


def test_the_20_10_cli_has_buildkit_built_in() -> None:
    """Debian's docker.io CLI, which .ci/setup installs."""
    cli = buildkit.find_cli("/usr/bin/docker")
    assert isinstance(cli, buildkit.Cli), cli
    assert cli.argv == ("/usr/bin/docker", "build") and cli.env == {"DOCKER_BUILDKIT": "1"}

"""BuildKit's plain progress, as the 20.10 CLI printed it (tests/fixtures/buildkit: two real runs of
one Dockerfile, a failed RUN and a build the cache answered), read into steps, lines and failures.
The real builds are in tests/engine/test_build_engine.py."""

from __future__ import annotations

import re
import stat
from pathlib import Path

import pytest

from fa_images.errors import StepFailed
from fa_images.run import buildkit
from fa_images.run.image_builder import BuildProgress, Output

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


def test_the_log_says_how_long_each_step_of_a_stage_took() -> None:
    """Stages run at once under BuildKit: a step's time is its DONE line, said once, for steps of a
    second or more, BuildKit's own ([internal]) among them; a short one says nothing."""
    stream, lines = buildkit._Stream(), []
    for line in [
        "#1 [internal] load build context",
        "#1 DONE 4.0s",
        "#6 [torch 2/2] RUN pip install torch==2.11.0",
        "#6 12.500 Successfully installed torch",
        "#8 [builder 1/3] RUN command -v git",
        "#8 DONE 0.2s",
        "#6 DONE 92.3s",
    ]:
        buildkit._read(line, stream, lines.append, lambda _: None)
    timed = [line for line in lines if "done in" in line]
    assert timed == ["[internal] load build context done in 4.0 s", "[torch 2/2] done in 92.3 s"]


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


_REAL_FIND_CLI = buildkit.find_cli  # this module tests the finder the rest of the unit tier stubs


@pytest.fixture(autouse=True)
def _the_real_finder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(buildkit, "find_cli", _REAL_FIND_CLI)


@pytest.mark.parametrize(
    ("version", "found"),
    [("28.2.2", "has no buildx plugin, which its BuildKit needs"), ("nonsense", "does not answer `docker version`")],
)
def test_a_cli_without_buildkit_says_why(tmp_path: Path, version: str, found: str) -> None:
    # An error path, with a stand-in CLI: buildx missing, and the version it reports.
    docker = _script(tmp_path / "docker", f'[ "$1" = buildx ] && exit 1\necho {version}\n')
    said = buildkit.find_cli(docker)
    assert isinstance(said, str) and found in said


def test_a_cli_before_23_has_buildkit_built_in(tmp_path: Path) -> None:
    """Debian's docker.io 20.10 CLI, as it answers (the real one is the engine tier's)."""
    docker = _script(tmp_path / "docker", '[ "$1" = buildx ] && exit 1\necho 20.10.24+dfsg1\n')
    cli = buildkit.find_cli(docker)
    assert isinstance(cli, buildkit.Cli), cli
    assert cli.argv == (docker, "build") and cli.env == {"DOCKER_BUILDKIT": "1"}


def test_a_cli_with_buildx_builds_through_it(tmp_path: Path) -> None:
    docker = _script(
        tmp_path / "docker", '[ "$1" = buildx ] && echo "github.com/docker/buildx v0.20.0" && exit 0\nexit 1\n'
    )
    cli = buildkit.find_cli(docker)
    assert isinstance(cli, buildkit.Cli) and cli.argv == (docker, "buildx", "build") and cli.loads


def test_no_cli_on_path_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert buildkit.find_cli() == "there is no docker CLI on PATH"


# A stand-in CLI for the order and the arguments of a request's builds: it logs its arguments,
# writes the image id where --iidfile says and a file where --output says, fails the stage named
# in $FAIL_STAGE, and says an image has $TAGS names. The real builds are the engine tier's.
_RECORDING_CLI = """
echo "$*" >> "$LOG"
if [ "$1" = image ]; then
  [ "$2" = inspect ] && echo "${TAGS:-0}"
  exit 0
fi
target=""; while [ $# -gt 0 ]; do
  case "$1" in
    --target) target="$2"; shift;;
    --iidfile) echo sha256:0123 > "$2"; shift;;
    --output) mkdir -p "${2#type=local,dest=}" && echo data > "${2#type=local,dest=}/f"; shift;;
  esac; shift
done
[ "$target" = "$FAIL_STAGE" ] && { echo "#3 ERROR: process did not complete successfully: exit code: 1"; exit 1; }
echo "#1 [$target 1/1] RUN true"
"""


def _recorded_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: str = "", tags: int = 0
) -> tuple[list[str], object]:
    from fa_images.run.image_builder import BuildRequest

    log = tmp_path / "argv.log"
    monkeypatch.setenv("LOG", str(log))
    monkeypatch.setenv("FAIL_STAGE", fail)
    monkeypatch.setenv("TAGS", str(tags))
    docker = _script(tmp_path / "docker", _RECORDING_CLI)
    cli = buildkit.Cli((docker, "build"), {"DOCKER_BUILDKIT": "1"}, "stand-in", loads=False)
    (tmp_path / "ctx").mkdir()
    request = BuildRequest(
        context=tmp_path / "ctx",
        target="runtime",
        tag="reg.example:5000/fa:1",
        outputs=(
            Output(stage="builder", tag="reg.example:5000/fa:1-builder"),
            Output(stage="wheel", dest=tmp_path / "wheel"),
            Output(stage="compiler-cache", dest=tmp_path / "cache", best_effort=True),
        ),
        before=("torch", "compiler-cache-in"),
        best_effort=frozenset({"compiler-cache-in"}),
        anew=frozenset({"compiler-cache-in", "compiler-cache"}),
        cache_from=("reg.example:5000/fa:1", "reg.example:5000/fa:1-builder"),
        inline_cache=True,
    )
    result = buildkit.BuildKitBuilder(cli).build(request, on_line=lambda _: None, on_progress=lambda _: None)
    return log.read_text().splitlines(), result


def test_a_request_is_builds_in_order_with_the_cache_in_and_out_built_anew(tmp_path, monkeypatch) -> None:
    calls, result = _recorded_build(tmp_path, monkeypatch)
    builds = [call for call in calls if call.startswith("build ")]
    targets = [call.split("--target ")[1].split()[0] for call in builds]
    assert targets == ["torch", "compiler-cache-in", "runtime", "builder", "wheel", "compiler-cache"]
    torch, fill, image, builder, wheel, cache = builds
    # A cache mount's content: no cache key covers it. A new FA_IMAGES_ANEW each time, never
    # --no-cache, which would give the step an empty cache mount.
    anew = [re.search(r"--build-arg FA_IMAGES_ANEW=([0-9a-f]{32})\b", call) for call in (fill, cache)]
    assert all(anew) and anew[0].group(1) != anew[1].group(1)  # type: ignore[union-attr]
    assert "FA_IMAGES_ANEW" not in torch + image + builder + wheel  # the torch stage: from the cache
    assert "--no-cache" not in "".join(calls)
    inline = "--build-arg BUILDKIT_INLINE_CACHE=1"
    assert inline in image and inline in builder  # both pushed: the next host imports from them
    assert "--cache-from reg.example:5000/fa:1 --cache-from reg.example:5000/fa:1-builder" in image
    # The torch stage as the target's build would take it: from the registry's build cache.
    assert "--cache-from reg.example:5000/fa:1 --cache-from reg.example:5000/fa:1-builder" in torch
    assert "--cache-from" not in fill + builder + wheel + cache  # the target's build took it already
    assert result.image_id == "sha256:0123" and not result.missed
    assert (tmp_path / "cache" / "f").read_text() == "data\n"
    # Each stage built first leaves an image with no name, which goes; the target's stays.
    assert [call for call in calls if not call.startswith("build ")] == [
        "image inspect --format {{len .RepoTags}} sha256:0123",
        "image rm sha256:0123",
    ] * 2


def test_a_named_image_of_a_stage_built_first_is_left_alone(tmp_path, monkeypatch) -> None:
    calls, _ = _recorded_build(tmp_path, monkeypatch, tags=1)
    assert not [call for call in calls if call.startswith("image rm")]


def test_a_torch_stage_that_fails_fails_the_build(tmp_path, monkeypatch) -> None:
    """The torch stage, built first, is the build's own: its failure is the build's, not a miss."""
    with pytest.raises(StepFailed, match=r"exited with 1"):
        _recorded_build(tmp_path, monkeypatch, fail="torch")
    builds = [line for line in (tmp_path / "argv.log").read_text().splitlines() if line.startswith("build ")]
    assert len(builds) == 1, builds  # nothing after it


def test_a_cache_that_cannot_go_in_costs_a_compile_not_the_build(tmp_path, monkeypatch) -> None:
    _calls, result = _recorded_build(tmp_path, monkeypatch, fail="compiler-cache-in")
    assert result.image_id == "sha256:0123"
    assert list(result.missed) == ["compiler-cache-in"]
    print(result.missed)
    assert result.missed["compiler-cache-in"] == "the build exited with 1"


def test_buildx_writes_the_inline_cache_its_own_way() -> None:
    cli = buildkit.Cli(("docker", "buildx", "build"), {}, "buildx", loads=True)
    assert cli.inline_cache == ("--cache-to", "type=inline")

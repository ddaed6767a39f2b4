"""BuildKit behind ``ImageBuilder``, driven through the docker CLI: ``docker buildx build``, or
``DOCKER_BUILDKIT=1 docker build`` where the CLI has BuildKit built in (before Docker 23).

The CLI talks to the daemon the SDK talks to: both read ``DOCKER_HOST``, else the active
context (``connect``). Its ``--progress=plain`` lines are parsed into the same progress, log lines
and one-line failures as the legacy builder's. One output per build (20.10's BuildKit allows no
more): the target is built and tagged first, then each stage to tag and each stage whose files
are taken is one more build, which BuildKit answers from its cache.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..builder import contract, untrusted
from ..config.grammar import BuilderForm
from ..errors import StepFailed
from .engine import short
from .image_builder import (
    BuildProgress,
    BuildRequest,
    BuildResult,
    OnLine,
    noting_a_miss,
    refuse_unsupported,
    step_failure,
)

# "#7 [builder 2/5] RUN pip install …", "#7 0.062 output", "#7 CACHED", "#7 DONE 92.3s",
# "#7 ERROR: … exit code: 3"
_VERTEX = re.compile(r"^#(\d+) \[([^\]]*)\] (.*)$")
_OUTPUT = re.compile(r"^#(\d+) \d+\.\d+ (.*)$")
_CACHED = re.compile(r"^#(\d+) CACHED$")
_DONE = re.compile(r"^#(\d+) DONE (\d+\.\d+)s$")
TIMED_STEP = 1.0  # seconds: a step that took longer has its time in the log
_VERTEX_ERROR = re.compile(r"^#(\d+) ERROR: (.*)$")
_EXIT_CODE = re.compile(r"exit code: (\d+)")
_STAGE_STEP = re.compile(r"^(\S+) (\d+)/(\d+)$")
_ERROR = re.compile(r"\berror\b|FAILED:|Killed", re.IGNORECASE)
MAX_LINE = 4000  # characters of one output line kept; a compiler can print longer ones
PROBE_TIMEOUT = 30  # seconds for `docker buildx version` / `docker version`


@dataclass(frozen=True)
class Cli:
    """How this machine's docker CLI runs a BuildKit build."""

    argv: tuple[str, ...]  # up to and without the build's own arguments
    env: dict[str, str]  # added to the environment
    what: str  # as the engine line says it
    loads: bool  # buildx: a tagged build needs --load (a builder of another driver keeps it otherwise)

    @property
    def inline_cache(self) -> tuple[str, ...]:
        """The arguments that write the build cache into the tagged image's config."""
        return ("--cache-to", "type=inline") if self.loads else ("--build-arg", "BUILDKIT_INLINE_CACHE=1")


def find_cli(docker: str | None = None) -> Cli | str:
    """The docker CLI's way to BuildKit, or why it has none (a sentence)."""
    docker = docker or shutil.which("docker")
    if docker is None:
        return "there is no docker CLI on PATH"
    buildx = _probe([docker, "buildx", "version"])
    if buildx is not None:
        return Cli((docker, "buildx", "build"), {}, f"`docker buildx build` ({buildx.strip()[:80]})", loads=True)
    version = _probe([docker, "version", "--format", "{{.Client.Version}}"], ok_codes=(0, 1))
    if version is None or not re.match(r"^\d+\.", version.strip()):
        return f"{docker} does not answer `docker version`"
    client = version.strip().splitlines()[0][:40]
    if int(client.split(".")[0]) >= 23:
        return f"the docker CLI {client} at {docker} has no buildx plugin, which its BuildKit needs"
    return Cli(
        (docker, "build"),
        {"DOCKER_BUILDKIT": "1"},
        f"`DOCKER_BUILDKIT=1 docker build` (docker CLI {client})",
        loads=False,
    )


def _probe(argv: Sequence[str], ok_codes: tuple[int, ...] = (0,)) -> str | None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode in ok_codes and proc.stdout.strip() else None


@dataclass
class _Stream:
    """What the lines of one build said: each step's stage and instruction, which were cached."""

    steps: dict[str, BuildProgress] = field(default_factory=dict)  # vertex number -> its step
    names: dict[str, str] = field(default_factory=dict)  # vertex number -> "[torch 2/2]", "[internal] load …"
    cached: set[str] = field(default_factory=set)  # vertex numbers
    output: dict[str, list[str]] = field(default_factory=dict)  # vertex number -> its error-like lines
    failed: tuple[str, str] | None = None  # vertex number, BuildKit's error
    tail: list[str] = field(default_factory=list)

    def cached_stages(self) -> frozenset[str]:
        """Stages whose every step (FROM aside, which BuildKit never calls cached) was cached."""
        by_stage: dict[str, list[bool]] = {}
        for number, step in self.steps.items():
            if step.stage and not step.instruction.upper().startswith("FROM "):
                by_stage.setdefault(step.stage, []).append(number in self.cached)
        return frozenset(stage for stage, cached in by_stage.items() if all(cached))


class BuildKitBuilder:
    def __init__(self, cli: Cli) -> None:
        self.cli = cli

    @property
    def form(self) -> BuilderForm:
        return "buildkit"

    def describe(self) -> str:
        return f"BuildKit through {self.cli.what}"

    def build(
        self, request: BuildRequest, *, on_line: OnLine, on_progress: Callable[[BuildProgress], None]
    ) -> BuildResult:
        refuse_unsupported(self, request)
        quiet: OnLine = lambda _: None  # noqa: E731 - a short build apart, or one answered from the cache
        missed: dict[str, str] = {}

        def side_build(stage: str, output: list[str], dest: Path | None = None, *, shown: bool = False) -> None:
            # A new value of the stage's ANEW_ARG: its step runs again. (--no-cache would too, and
            # BuildKit would hand it an empty cache mount, which then replaces the group's.)
            anew = ["--build-arg", f"{contract.ANEW_ARG}={uuid.uuid4().hex}"] if stage in request.anew else []
            with noting_a_miss(request, stage, missed):
                lines, progress = (on_line, on_progress) if shown else (quiet, lambda _: None)
                self._run(request, stage, [*anew, *output], on_line=lines, on_progress=progress)
                if dest is not None:
                    _keep_files_and_dirs(dest)

        # A ref that is not there (the first build anywhere) costs a warning line, not the build.
        cache_from = [arg for ref in request.cache_from for arg in ("--cache-from", ref)]
        with tempfile.TemporaryDirectory(prefix="fa-images-iid-") as tmp:
            for stage in request.before:  # the torch install is the build's too: shown as it goes
                iidfile = Path(tmp) / f"{stage}.iid"
                # The torch stage from the registry's build cache where it is there, as the target's
                # build would take it: the image then has the layers another host pushed.
                imported = [] if stage in request.anew else cache_from
                side_build(stage, ["--iidfile", str(iidfile), *imported], shown=not request.is_best_effort(stage))
                self._forget_untagged(iidfile)
            inline = list(self.cli.inline_cache) if request.inline_cache else []
            iidfile = Path(tmp) / "iid"
            labels = [arg for k, v in sorted(request.labels.items()) for arg in ("--label", f"{k}={v}")]
            stream = self._run(
                request,
                request.target,
                ["-t", request.tag, "--iidfile", str(iidfile), *labels, *inline, *cache_from],
                on_line=on_line,
                on_progress=on_progress,
            )
            image_id = iidfile.read_text().strip() if iidfile.is_file() else ""
        if not image_id.startswith("sha256:"):
            raise StepFailed("BuildKit finished the build without writing the image's id", lines=stream.tail[-20:])
        for stage, ref in request.stage_tags.items():
            side_build(stage, ["-t", ref, *inline])
        for stage, dest in request.files.items():
            side_build(stage, ["--output", f"type=local,dest={dest}"], dest)
        return BuildResult(image_id, {}, stream.cached_stages(), missed)

    def _forget_untagged(self, iidfile: Path) -> None:
        """The image a stage built first left, if no name holds it: its layers stay in the build
        cache and under the images made on them, and `docker images` lists no nameless copy."""
        image = iidfile.read_text().strip() if iidfile.is_file() else ""
        if not image.startswith("sha256:"):
            return  # a builder that keeps its results to itself (buildx's other drivers)
        docker = self.cli.argv[0]
        tags = _probe([docker, "image", "inspect", "--format", "{{len .RepoTags}}", image])
        if tags is not None and tags.strip() == "0":  # one left behind is `docker image prune`'s
            _probe([docker, "image", "rm", image])

    def _run(
        self,
        request: BuildRequest,
        target: str,
        output: list[str],
        *,
        on_line: OnLine,
        on_progress: Callable[[BuildProgress], None],
    ) -> _Stream:
        argv = [*self.cli.argv, "--progress=plain", "--target", target, "-f", str(request.context / "Dockerfile")]
        argv += ["--network", request.network] if request.network else []
        argv += ["--load"] if self.cli.loads and "-t" in output else []
        argv += [*output, str(request.context)]
        stream = _Stream()
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.cli.env},
            text=True,
            errors="replace",
        )
        try:
            assert proc.stdout is not None
            for line in _lines(proc.stdout):
                _read(line, stream, on_line, on_progress)
            code = proc.wait()
        finally:
            if proc.poll() is None:  # Ctrl-C or an error here: the CLI cancels the build when told
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
        if code != 0:
            raise _failure(stream, code)
        return stream


def _lines(text: Iterator[str]) -> Iterator[str]:
    for raw in text:
        line = untrusted.shown(raw.rstrip("\n")[:MAX_LINE]).rstrip()
        if line:
            yield line


def _read(line: str, stream: _Stream, on_line: OnLine, on_progress: Callable[[BuildProgress], None]) -> None:
    stream.tail = (stream.tail + [line])[-40:]
    if vertex := _VERTEX.match(line):
        number, where, instruction = vertex.groups()
        stage_step = _STAGE_STEP.match(where)
        if stage_step:  # "[internal] load …" steps are BuildKit's own
            stage, step, total = stage_step.group(1), int(stage_step.group(2)), int(stage_step.group(3))
            progress = stream.steps[number] = BuildProgress(step, total, instruction, stage)
            on_progress(progress)
        stream.names[number] = f"[{where}]" if stage_step else f"[{where}] {short(instruction)}"
        on_line(line)
    elif output := _OUTPUT.match(line):
        number, text = output.groups()
        if _ERROR.search(text):
            stream.output.setdefault(number, []).append(text)
        on_line(text)
    elif cached := _CACHED.match(line):
        stream.cached.add(cached.group(1))
    elif (done := _DONE.match(line)) and (name := stream.names.get(done.group(1))):
        # BuildKit runs stages at once, so a step's time is not the gap between two lines: say it,
        # BuildKit's own steps too (the context's transfer).
        if (seconds := float(done.group(2))) >= TIMED_STEP:
            on_line(f"{name} done in {seconds:.1f} s")
    elif error := _VERTEX_ERROR.match(line):
        stream.failed = (error.group(1), error.group(2))
        on_line(line)
    elif not line.startswith("#"):  # BuildKit's summary of a failure, the CLI's own messages
        on_line(line)


def _failure(stream: _Stream, code: int) -> StepFailed:
    """One line, as the legacy builder's: the step, its exit code, the builder's last error line."""
    if stream.failed is None:
        said = [line for line in stream.tail if "error" in line.lower()] or stream.tail or ["?"]
        return StepFailed(
            f"the build failed (the CLI exited with {code}): {untrusted.error_line(said[-1])}",
            lines=stream.tail[-12:],
        )
    number, message = stream.failed
    exit_code = _EXIT_CODE.search(message)
    step_code = exit_code.group(1) if exit_code else None
    return step_failure(stream.steps.get(number), step_code, message, stream.output.get(number, []), stream.tail)


def _keep_files_and_dirs(dest: Path) -> None:
    """What BuildKit's local output wrote, less every link and special file: a stage's files are
    read as data, and a link in them (a hostile setup.py can leave one) must not be followed."""
    for root, dirs, files in os.walk(dest):
        for name in dirs + files:
            path = Path(root) / name
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                path.unlink()
        dirs[:] = [d for d in dirs if (Path(root) / d).is_dir() and not (Path(root) / d).is_symlink()]

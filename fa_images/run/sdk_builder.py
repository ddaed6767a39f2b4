"""The docker SDK's legacy builder behind ``ImageBuilder``: one streamed build of the target, whose
"---> id" lines name the image each stage left; stages are tagged and exported from those ids.

It builds the Dockerfile form without BuildKit syntax (the torch venv and the compiler cache are
copied into the builder stage), and it is the builder Podman's Docker API answers to. Docker's
own CLI deprecates it; ``buildkit.BuildKitBuilder`` is the other.
"""

from __future__ import annotations

import re
import tarfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..config.grammar import BuilderForm
from ..errors import StepFailed
from .engine import engine_call
from .image_builder import (
    BuildProgress,
    BuildRequest,
    BuildResult,
    OnLine,
    noting_a_miss,
    refuse_unsupported,
    step_failure,
)

# A step's first line, exactly as each engine writes it: Docker's "Step 2/9 : RUN ...", Podman's
# "[2/7] STEP 1/4: RUN ..." (the stage's number first, the step's within its stage). A RUN's own
# output ("Step 2/5: building wheels") is not one.
_STEP = re.compile(r"^(?:Step (\d+)/(\d+) : |(?:\[\d+/\d+\] )?STEP (\d+)/(\d+): )([A-Z]+\b.*)")
# The legacy builder's line after each step: the image that step left (Podman's prints "--> ").
_STEP_IMAGE = re.compile(r"^ ?--?-> ([0-9a-f]{12,64})$")
# A RUN's exit code, as Docker says it and as Podman does ("while running runtime: exit status 3").
_EXIT_CODE = re.compile(r"returned a non-zero code: (\d+)|while running runtime: exit status (\d+)\s*$")
_ERROR = re.compile(r"\berror\b|FAILED:|Killed", re.IGNORECASE)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# What an engine adds to a container of a FROM-scratch image: not the stage's files.
_ENGINE_MADE = frozenset({".dockerenv", "dev", "proc", "sys", "etc"})

_DATA_FILTER: dict = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}


class LegacyEngine(Protocol):
    """What the legacy builder needs of its engine (``engine.DockerEngine`` answers it)."""

    def legacy_build(self, **kwargs: Any) -> Iterator[dict[str, Any]]: ...

    def files_of(self, image: str) -> AbstractContextManager[Iterator[bytes]]: ...

    def tag(self, image: str, ref: str) -> None: ...


class SdkBuilder:
    def __init__(self, engine: LegacyEngine) -> None:
        self.engine = engine

    @property
    def form(self) -> BuilderForm:
        return "sdk"

    def describe(self) -> str:
        return "the docker SDK's legacy builder"

    def build(
        self, request: BuildRequest, *, on_line: OnLine, on_progress: Callable[[BuildProgress], None]
    ) -> BuildResult:
        def build(target: str, tag: str | None, *, live: bool) -> tuple[str, dict[str, str]]:
            return self._build_stage(
                context=request.context,
                target=target,
                tag=tag,
                network=request.network,
                memory=request.memory,
                labels=request.labels,
                on_line=on_line if live else lambda _: None,
                on_progress=on_progress if live else lambda _: None,
            )

        refuse_unsupported(self, request)
        image_id, stages = build(request.target, request.tag, live=True)
        missed: dict[str, str] = {}
        # The one build made every stage up to the target; one after it (or an engine whose output
        # names no stage ids) gets a build of its own, from the layer cache, which may fail: a
        # best-effort stage's failure is noted, as its export's would be.
        for stage in {**request.stage_tags, **request.files}:
            if stage not in stages:
                with noting_a_miss(request, stage, missed):
                    stages[stage] = build(stage, None, live=False)[0]
        for stage, ref in request.stage_tags.items():
            if stage not in missed:
                self.engine.tag(stages[stage], ref)
        for stage, dest in request.files.items():
            if stage not in missed:
                with noting_a_miss(request, stage, missed):
                    self._export_tree(stages[stage], dest)
        return BuildResult(image_id, stages, missed=missed)

    @engine_call("building")
    def _build_stage(
        self,
        *,
        context: Path,
        target: str,
        tag: str | None,
        network: str | None,
        memory: int | None,
        labels: Mapping[str, str],
        on_line: OnLine,
        on_progress: Callable[[BuildProgress], None],
    ) -> tuple[str, dict[str, str]]:
        # The limit holds for every RUN container; the builder reads it from its cgroup and
        # sizes its jobs by it. Swap is no way out: memswap equal to memory means none.
        limits = {"memory": memory, "memswap": memory} if memory else None
        stream = self.engine.legacy_build(
            path=str(context),
            dockerfile="Dockerfile",
            target=target,
            tag=tag,
            rm=True,
            forcerm=True,
            decode=True,
            network_mode=network,
            container_limits=limits,
            labels=dict(labels) or None,
            pull=False,
        )
        read = _Stream(on_line, on_progress)
        for chunk in stream:
            read.chunk(chunk)
        if read.image_id is None:
            raise StepFailed("the engine finished the build without reporting an image id", lines=read.tail[-20:])
        return read.image_id, read.stages

    @engine_call("exporting the files of")
    def _export_tree(self, image: str, dest: Path) -> None:
        """Copies the files of a FROM-scratch stage into ``dest``, streamed through a file beside it
        (a compiler cache runs to gigabytes) and extracted by tarfile's "data" filter: regular
        files and directories only."""
        spool = dest.with_name(dest.name + ".tar")
        try:
            with self.engine.files_of(image) as chunks, spool.open("wb") as out:
                for chunk in chunks:
                    out.write(chunk)
            with tarfile.open(spool) as tar:
                for member in tar:
                    name = member.name.removeprefix("./").lstrip("/")
                    if not name or name.split("/")[0] in _ENGINE_MADE or not (member.isfile() or member.isdir()):
                        continue
                    # The tar filter where this Python has it (3.10.12, 3.11.4 and later): a second check.
                    tar.extract(member.replace(name=name), dest, **_DATA_FILTER)
        finally:
            spool.unlink(missing_ok=True)


@dataclass
class _Stream:
    """What the legacy builder's decoded stream says: each step's progress, the image each stage
    left (its "---> id" lines), the target's id, and a failure as one line."""

    on_line: OnLine
    on_progress: Callable[[BuildProgress], None]
    image_id: str | None = None
    stages: dict[str, str] = field(default_factory=dict)
    stage: str | None = None
    step: BuildProgress | None = None
    tail: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # the current step's lines that name an error

    def chunk(self, chunk: dict[str, Any]) -> None:
        if "error" in chunk or "errorDetail" in chunk:
            message = str(chunk.get("error") or chunk["errorDetail"].get("message", "build failed"))
            code = _EXIT_CODE.search(message)
            raise step_failure(self.step, code and (code[1] or code[2]), message, self.errors, self.tail)
        if "aux" in chunk and isinstance(chunk["aux"], dict) and "ID" in chunk["aux"]:
            self.image_id = chunk["aux"]["ID"]
        for line in _ANSI.sub("", str(chunk.get("stream", ""))).splitlines():
            if line := line.rstrip():
                self.line(line)

    def line(self, line: str) -> None:
        if match := _STEP.match(line):
            number, total = (match[1], match[2]) if match[1] else (match[3], match[4])
            instruction = match[5]
            from_as = re.match(r"FROM \S+ AS (\S+)", instruction, re.IGNORECASE)
            self.stage = from_as.group(1) if from_as else self.stage
            self.step = BuildProgress(int(number), int(total), instruction, self.stage)
            self.errors = []
            self.on_progress(self.step)
        if (made := _STEP_IMAGE.match(line)) and self.stage is not None:
            self.stages[self.stage] = made.group(1)
        if (built := re.match(r"Successfully built ([0-9a-f]+)", line)) and self.image_id is None:
            self.image_id = built.group(1)
        if _ERROR.search(line):
            self.errors.append(line)
        self.tail = (self.tail + [line])[-40:]
        self.on_line(line)

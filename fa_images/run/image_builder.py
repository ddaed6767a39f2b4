"""What one build must produce, and the interface both image builders answer.

The executor says *what* it needs (``BuildRequest``: the target image and its tag, the stages to
tag, the stages whose files it takes) and never *how*: the docker SDK's legacy builder
(``sdk_builder``) gets stages by their image ids and copies their files out of containers;
BuildKit (``buildkit``) builds each from its cache and writes files through ``--output``.
Pulling, running, tagging and pushing are the container runtime's (``engine.Engine``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..config.grammar import BuilderForm
from ..errors import StepFailed

OnLine = Callable[[str], None]


@dataclass(frozen=True)
class BuildProgress:
    step: int
    total: int
    instruction: str
    stage: str | None


@dataclass(frozen=True, kw_only=True)
class BuildRequest:
    context: Path  # holds the Dockerfile, rendered for this builder's form
    target: str  # the stage built and tagged ``tag``, with every stage it needs
    tag: str
    stage_tags: Mapping[str, str] = field(default_factory=dict)  # other stages, tagged: stage -> ref
    # Stages built before the target, each in a build of its own (BuildKit's form only): torch-commit,
    # which installs torch and commits it before the compile mounts it; compiler-cache-in, anew, which
    # moves the host's compiler cache into the builder's cache mount.
    before: tuple[str, ...] = ()
    # Stages whose files the executor takes: stage -> an empty directory made by the caller, which
    # receives the stage's regular files and directories (never a link or a device).
    files: Mapping[str, Path] = field(default_factory=dict)
    # Of those, the stages whose files are a help, not a result (the compiler cache): when they
    # cannot be taken, the build still succeeds and says why in ``BuildResult.missed``.
    best_effort: frozenset[str] = frozenset()
    # Of ``before`` and ``files``, the stages the builder must build anew in a build of their own
    # (such a stage declares ``contract.ANEW_ARG``, given a new value): they read or fill a cache
    # mount, whose content no cache key covers. (The legacy builder's stages come from the one
    # build, which has no cache mount: nothing of theirs can be stale.)
    anew: frozenset[str] = frozenset()
    # Registry refs whose build cache this build may take, and whether the images it tags carry
    # their own for the next host (BuildKit's inline cache; the legacy builder has neither).
    cache_from: tuple[str, ...] = ()
    inline_cache: bool = False
    network: str | None = None
    memory: int | None = None  # bytes, a limit on every RUN (only the legacy builder can set one)
    labels: Mapping[str, str] = field(default_factory=dict)  # on the target image


@dataclass(frozen=True)
class BuildResult:
    image_id: str  # the target's
    stage_ids: Mapping[str, str] = field(default_factory=dict)  # stage -> image id, where the builder knows it
    # Stages the build cache answered whole (nothing in them ran); BuildKit says so of each step.
    cached_stages: frozenset[str] = frozenset()
    missed: Mapping[str, str] = field(default_factory=dict)  # best-effort stage -> why its files are not there


@contextlib.contextmanager
def noting_a_miss(request: BuildRequest, stage: str, missed: dict[str, str]) -> Iterator[None]:
    """Runs what makes ``stage``'s result; if it fails and the stage is best effort, notes why in
    ``missed`` (for ``BuildResult.missed``) instead of failing the build."""
    try:
        yield
    except (StepFailed, OSError) as exc:
        if stage not in request.best_effort:
            raise
        missed[stage] = str(exc)


class ImageBuilder(Protocol):
    """Turns a ``BuildRequest`` into images, tags and files, streaming the build's lines."""

    @property
    def form(self) -> BuilderForm:
        """The Dockerfile form this builder builds (``render.render_entry``'s ``builder``)."""
        ...

    def describe(self) -> str: ...

    def build(
        self, request: BuildRequest, *, on_line: OnLine, on_progress: Callable[[BuildProgress], None]
    ) -> BuildResult: ...

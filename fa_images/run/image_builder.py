"""What one build must produce, and the interface both image builders answer.

The executor says *what* it needs (``BuildRequest``: the target image and its tag, and its
``Output`` list: the stages to tag, the stages whose files it takes) and never *how*; a builder
refuses what it cannot do (``refuse_unsupported``) rather than ignore it: the docker SDK's legacy builder
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

from ..builder import untrusted
from ..config.grammar import BuilderForm
from ..errors import StepFailed
from .engine import short

OnLine = Callable[[str], None]


@dataclass(frozen=True)
class BuildProgress:
    step: int
    total: int
    instruction: str
    stage: str | None


@dataclass(frozen=True, kw_only=True)
class Output:
    """What a build leaves of one stage: an image tagged ``tag``, or its files in ``dest``, an
    empty directory made by the caller, which receives the stage's regular files and directories
    (never a link or a device)."""

    stage: str
    tag: str | None = None
    dest: Path | None = None
    # A help, not a result (the compiler cache): when it cannot be made, the build still succeeds
    # and says why in ``BuildResult.missed``.
    best_effort: bool = False

    def __post_init__(self) -> None:
        if (self.tag is None) == (self.dest is None):
            raise ValueError(f"an output of {self.stage} is a tag or a directory, one of the two")


@dataclass(frozen=True, kw_only=True)
class BuildRequest:
    context: Path  # holds the Dockerfile, rendered for this builder's form
    target: str  # the stage built and tagged ``tag``, with every stage it needs
    tag: str
    outputs: tuple[Output, ...] = ()  # what else the build leaves: other stages tagged, stages' files
    # Stages built before the target, each in a build of its own (BuildKit's form only): torch-commit,
    # which installs torch and commits it before the compile mounts it; compiler-cache-in, anew, which
    # moves the host's compiler cache into the builder's cache mount. Best effort ones in ``best_effort``.
    before: tuple[str, ...] = ()
    best_effort: frozenset[str] = frozenset()  # of ``before``: a failure is noted in ``missed``
    # Of ``before`` and the outputs, the stages the builder must build anew in a build of their own
    # (such a stage declares ``contract.ANEW_ARG``, given a new value): they read or fill a cache
    # mount, whose content no cache key covers.
    anew: frozenset[str] = frozenset()
    # Registry refs whose build cache this build may take, and whether the images it tags carry
    # their own for the next host (BuildKit's inline cache).
    cache_from: tuple[str, ...] = ()
    inline_cache: bool = False
    network: str | None = None
    memory: int | None = None  # bytes, a limit on every RUN (only the legacy builder can set one)
    labels: Mapping[str, str] = field(default_factory=dict)  # on the target image

    @property
    def stage_tags(self) -> dict[str, str]:
        return {o.stage: o.tag for o in self.outputs if o.tag is not None}

    @property
    def files(self) -> dict[str, Path]:
        return {o.stage: o.dest for o in self.outputs if o.dest is not None}

    def is_best_effort(self, stage: str) -> bool:
        return stage in self.best_effort or any(o.stage == stage and o.best_effort for o in self.outputs)


@dataclass(frozen=True)
class BuildResult:
    image_id: str  # the target's
    stage_ids: Mapping[str, str] = field(default_factory=dict)  # stage -> image id, where the builder knows it
    # Stages the build cache answered whole (nothing in them ran); BuildKit says so of each step.
    cached_stages: frozenset[str] = frozenset()
    missed: Mapping[str, str] = field(default_factory=dict)  # best-effort stage -> why its files are not there


def step_failure(
    step: BuildProgress | None, code: str | None, message: str, errors: list[str], tail: list[str]
) -> StepFailed:
    """A failed build as one line, whichever builder: the stage and step, its exit code (or the
    builder's message), and the step's last error line, which names the cause."""
    what = f"exited with {code}" if code else f"failed: {untrusted.error_line(message)}"
    where = "the build"
    if step is not None:
        where = f"{step.stage + ' ' if step.stage else ''}step {step.step}/{step.total} ({short(step.instruction)})"
    cause = f": {untrusted.error_line(errors[-1].strip().removeprefix('error: '))}" if errors else ""
    return StepFailed(
        f"{where} {what}{cause}",
        step=step.instruction if step else None,
        lines=list(dict.fromkeys(errors[-6:] + tail[-6:])),
    )


def unsupported(form: BuilderForm, request: BuildRequest) -> list[str]:
    """What ``request`` asks that a builder of ``form`` cannot do: BuildKit's CLI has no memory
    limit on a build's containers; the legacy builder's stages come from one build, which has no
    cache mount, no mount of another stage and no build cache to import or export."""
    if form == "buildkit":
        asked = {"limit a build's memory (build.memory)": request.memory is not None}
    else:
        asked = {
            f"build stages first ({', '.join(request.before)})": bool(request.before),
            f"build stages anew ({', '.join(sorted(request.anew))})": bool(request.anew),
            "take a registry's build cache (--cache-from)": bool(request.cache_from),
            "write an inline build cache": request.inline_cache,
        }
    return [what for what, wanted in asked.items() if wanted]


def refuse_unsupported(builder: ImageBuilder, request: BuildRequest) -> None:
    """A request for what ``builder`` cannot do fails before anything is built, naming it."""
    if cannot := unsupported(builder.form, request):
        raise StepFailed(f"{builder.describe()} cannot do what this build asks: {'; '.join(cannot)}")


@contextlib.contextmanager
def noting_a_miss(request: BuildRequest, stage: str, missed: dict[str, str]) -> Iterator[None]:
    """Runs what makes ``stage``'s result; if it fails and the stage is best effort, notes why in
    ``missed`` (for ``BuildResult.missed``) instead of failing the build."""
    try:
        yield
    except (StepFailed, OSError) as exc:
        if not request.is_best_effort(stage):
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

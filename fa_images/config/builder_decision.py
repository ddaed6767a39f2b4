"""Which image builder makes the images, decided in this one place: the choice (``--builder`` >
``build.builder`` > ``auto``), then what the settings and the host allow.

BuildKit (``RUN --mount``: the torch venv mounted, not copied; the compiler cache in a cache mount)
is taken wherever it can be. The docker SDK's legacy builder stays for what BuildKit cannot serve,
and only there:

- an engine whose Docker API has no BuildKit: Podman's compatible API lacks BuildKit's endpoints
  (podman issue 17836, open; its maintainers name ``DOCKER_BUILDKIT=0`` the way until they exist,
  issue 13889), and the engine tier's Podman module builds through it;
- a docker CLI without BuildKit: from 23 on, the CLI builds with BuildKit only through the buildx
  plugin, which plain installs of the CLI lack;
- ``build.memory``, a limit only the legacy builder sets on a build's containers (the compile
  sizes its jobs by it).

``render`` and the exports decide with no host (``host=None``): the form the settings name.
``build`` and its ``--dry-run`` decide with what the host said.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError
from .grammar import BuilderChoice, BuilderForm

DOCKER_ENGINE = "Docker Engine"  # the product name the engine gives; the one with BuildKit behind its API


@dataclass(frozen=True)
class Host:
    """What this host offers a build, as its probes said."""

    no_buildkit: str | None  # why the docker CLI has no BuildKit (a sentence); None: it has
    engine: str | None = None  # the engine's product name; None where no engine was asked (a plan)


@dataclass(frozen=True)
class BuilderDecision:
    choice: BuilderChoice  # as asked: flag > matrix > default
    form: BuilderForm  # the builder, and the Dockerfile form it builds
    why: str  # for the run's first lines


def decide(choice: BuilderChoice, *, memory_limit: bool, host: Host | None) -> BuilderDecision:
    """The builder for ``choice``; ``buildkit`` where it cannot serve is refused with why."""
    if choice == "sdk":
        return BuilderDecision(choice, "sdk", "asked for")
    against = _against_buildkit(memory_limit, host)
    if choice == "buildkit":
        if against is not None:
            raise UsageError(
                f"--builder buildkit: {against}",
                hint="install docker's buildx plugin, or use --builder sdk (the docker SDK's legacy builder)",
            )
        return BuilderDecision(choice, "buildkit", "asked for")
    if against is not None:
        return BuilderDecision(choice, "sdk", f"auto: {against}")
    return BuilderDecision(choice, "buildkit", "auto" if host else "auto: the form the settings name")


def _against_buildkit(memory_limit: bool, host: Host | None) -> str | None:
    if memory_limit:
        return "build.memory is a limit only the legacy builder can set on a build's containers"
    if host is None:
        return None
    if host.engine is not None and host.engine != DOCKER_ENGINE:
        return f"{host.engine} has no BuildKit behind its Docker API"
    return host.no_buildkit

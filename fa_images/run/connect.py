"""The engine and the image builder a run uses, chosen once: the factory in place of a hard-coded
``DockerEngine.from_env()``.

``auto`` takes BuildKit where the docker CLI has it and the engine is Docker's (Podman's Docker API
has no BuildKit), and the legacy builder of the docker SDK otherwise; the reason is said either way.
``buildkit`` and ``sdk`` are taken as asked, or refused with why.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config.grammar import BuilderChoice, BuilderForm
from ..errors import UsageError
from . import buildkit
from .engine import DockerEngine
from .image_builder import ImageBuilder
from .sdk_builder import SdkBuilder


@dataclass(frozen=True)
class Connection:
    engine: DockerEngine
    builder: ImageBuilder
    why: str  # why this builder, for the run's first lines


def connect(choice: BuilderChoice, *, memory: int | None = None) -> Connection:
    engine = DockerEngine.from_env()
    if choice == "sdk":
        return Connection(engine, SdkBuilder(engine), "asked for")
    refusal = _why_not_buildkit(engine, memory)
    cli = buildkit.find_cli() if refusal is None else refusal
    if isinstance(cli, buildkit.Cli):
        return Connection(engine, buildkit.BuildKitBuilder(cli), "asked for" if choice == "buildkit" else "auto")
    if choice == "buildkit":
        raise UsageError(
            f"--builder buildkit: {cli}",
            hint="install docker's buildx plugin, or use --builder sdk (the docker SDK's legacy builder)",
        )
    return Connection(engine, SdkBuilder(engine), f"auto: {cli}")


def expected_form(choice: BuilderChoice, *, needs_sdk: bool = False) -> BuilderForm:
    """The Dockerfile form ``connect`` would choose here, without asking an engine (a plan printed
    before any build): Podman, which only the engine can say it is, aside."""
    if choice == "sdk" or (choice == "auto" and needs_sdk):
        return "sdk"
    return "buildkit" if choice == "buildkit" or isinstance(buildkit.find_cli(), buildkit.Cli) else "sdk"


def _why_not_buildkit(engine: DockerEngine, memory: int | None) -> str | None:
    product = engine.product()
    if product != "Docker Engine":
        return f"{product} has no BuildKit behind its Docker API"
    if memory is not None:  # BuildOptions.needs_sdk
        return "build.memory is a limit only the legacy builder can set on a build's containers"
    return None

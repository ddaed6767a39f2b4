"""The engine and the image builder a run uses: the factory every command that talks to an engine
goes through (``build``, ``check``), in place of a hard-coded ``DockerEngine.from_env()``.

The builder is the one ``BuildOptions.decide_builder`` decides (``config/builder_decision.py``) from what
this host said: whether its docker CLI has BuildKit, and, for a build, which engine answers.
``build --dry-run`` asks the CLI only, as no engine is needed to print a plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config.builder_decision import BuilderDecision, Host
from ..config.grammar import BuilderChoice
from ..config.model import BuildOptions
from . import buildkit
from .engine import DockerEngine, Engine
from .image_builder import ImageBuilder
from .sdk_builder import SdkBuilder


@dataclass(frozen=True)
class Connection:
    engine: Engine
    builder: ImageBuilder
    decision: BuilderDecision


def engine() -> DockerEngine:
    """The engine of a command that builds nothing (``check``)."""
    return DockerEngine.from_env()


def connect(settings: BuildOptions, flag: BuilderChoice | None) -> Connection:
    """The engine, then the builder the decision gives for it."""
    docker = DockerEngine.from_env()
    cli = _cli(settings, flag)
    decision = settings.decide_builder(flag, host=_host(cli, engine=docker.product()))
    return Connection(docker, builder_for(decision, docker, cli), decision)


def builder_for(decision: BuilderDecision, docker: DockerEngine, cli: buildkit.Cli | str) -> ImageBuilder:
    if decision.form == "buildkit":
        assert isinstance(cli, buildkit.Cli)  # the decision takes BuildKit only where the CLI has it
        return buildkit.BuildKitBuilder(cli)
    return SdkBuilder(docker)


def planned(settings: BuildOptions, flag: BuilderChoice | None) -> BuilderDecision:
    """The decision ``connect`` makes here, before any engine is asked (``build --dry-run``): the
    engine's own answer (Podman has no BuildKit behind its API) aside."""
    return settings.decide_builder(flag, host=_host(_cli(settings, flag), engine=None))


def _cli(settings: BuildOptions, flag: BuilderChoice | None) -> buildkit.Cli | str:
    """The docker CLI's way to BuildKit, asked only where the settings leave BuildKit possible."""
    if settings.decide_builder(flag, host=None).form == "sdk":
        return "not asked: the settings name the legacy builder"
    return buildkit.find_cli()


def _host(cli: buildkit.Cli | str, *, engine: str | None) -> Host:
    return Host(no_buildkit=None if isinstance(cli, buildkit.Cli) else cli, engine=engine)

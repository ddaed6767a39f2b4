"""What each generation's module gives the builder: how its source becomes a prepared tree, how its
setup.py is run, the ``wheel`` flags it adds, and its checks of a built wheel. ``build.py``,
``cli.py`` and ``verify.py`` call these through ``Generation.steps()`` and never ask which
generation they hold.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..environment import NvccInfo, TorchInfo
    from ..settings import BuildSettings
    from ..source import SourceTree
    from ..verify import WheelReport
    from ..wheelfile import Wheel


@dataclass(frozen=True)
class SourceRequest:
    """What ``wheel`` was asked to build from."""

    version: str | None
    sdist: Path | None
    work_dir: Path
    sha256: str | None
    index_url: str
    sources_dir: Path | None
    archs: tuple[str, ...]
    label_archs: bool
    allow_untested: bool
    knobs: dict[str, Any] | None  # the generation's own settings, from its flags


@dataclass(frozen=True)
class PreparedSource:
    """The unpacked source, and what the generation decided of the build from it and the torch."""

    tree: SourceTree
    archs: tuple[str, ...]
    local_version: str | None
    ptx: bool  # whether PTX may be added (its setup.py takes gencode flags from the builder)
    knobs: dict[str, Any] | None  # recorded in the settings, read back by its setup environment


class Steps(Protocol):
    """A generation's builder module."""

    LABEL: re.Pattern[str]  # its wheel's +label: 'cu128torch2.9cxx11abitrue', 'cu13.k1a2b3c4d'
    FLAGS: tuple[str, ...]  # the destinations of its own ``wheel`` flags, refused for another generation

    def label(self, local: str) -> re.Match[str] | None: ...

    def from_flags(self, args: argparse.Namespace) -> tuple[dict[str, Any] | None, tuple[str, ...]]: ...

    def add_commands(self, sub: argparse._SubParsersAction) -> None: ...

    def prepare_source(self, request: SourceRequest, torch: TorchInfo) -> PreparedSource: ...

    def setup_command(self, python: str, src: Path, dist: Path, settings_file: Path) -> list[str]: ...

    def setup_environment(self, settings: BuildSettings, nvcc: NvccInfo) -> dict[str, str]: ...

    def add_wheel_flags(self, parser: argparse.ArgumentParser) -> None: ...

    def check_wheel(self, report: WheelReport, wheel: Wheel) -> None: ...

    def check_label(self, report: WheelReport, label: re.Match[str] | None, torch_here: dict) -> None: ...

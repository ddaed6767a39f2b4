"""What every generation's module gives the rest of the house: the recipe each of its entries carries.

An entry's generation is decided once, when the matrix is resolved (``resolve.py`` hands the
combination to the generation its flash-attn version names), and the recipe it gets answers
everything that differs between generations after that: the wheel's name and label, the compile
group, the builder's ``wheel`` flags, the image's install stage and labels, what a build job
compiles, the source it needs. Nothing else asks which generation an entry is.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from ...builder.generations import Generation

if TYPE_CHECKING:
    from ..model import Entry


@dataclass(frozen=True)
class Work:
    """What an entry's build job compiles: nvcc's core-seconds (spread over its jobs), the gencode
    targets of each kernel (which size those jobs), and seconds that run one after another."""

    nvcc_core_seconds: float
    targets: int
    serial_seconds: float
    what: str  # for a refusal: "compiles 2 arch(s) of flash-attn's kernels"
    shardable: bool = False  # whether --shards splits its nvcc work


@dataclass(frozen=True)
class InstallStage:
    """The image's install stage: its template fragment (``templates/install/``), what it fills in,
    the lines that say what it does, and the environment the runtime image keeps."""

    fragment: str
    about: tuple[str, ...]
    values: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


WHEEL_INSTALL = InstallStage(
    "wheel.j2", ("the wheel and its runtime dependencies installed on torch, pip check, import check",)
)


class Recipe(ABC):
    """A generation's way of making an entry's wheel and image. Subclasses are frozen dataclasses
    holding the generation's own settings (FlashAttention-3's knobs, FlashAttention-4's grid)."""

    generation: ClassVar[Generation]
    # A wheel compiled with nvcc in a builder stage (FlashAttention-4 has none: Python from the index).
    makes_wheel: ClassVar[bool] = True
    # Its source: "sdist" (an index serves it), "archive" (pinned, found in packages.sdists only) or
    # None (nothing to fetch: the build installs from the index).
    source: ClassVar[str | None] = "sdist"

    @abstractmethod
    def wheel_label(self, entry: Entry) -> str | None:
        """Its wheel's +label; None where it makes no wheel."""

    @abstractmethod
    def wheel_labels(self, entry: Entry) -> set[str]:
        """Every +label a wheel for this entry may carry (both C++ ABIs where its torch's is unknown)."""

    @abstractmethod
    def compile_group(self, entry: Entry) -> str:
        """The entries that share its kernels share this name."""

    def shares_wheel(self) -> bool:
        """Whether the entries of a compile group share one wheel (an abi3 one), built once."""
        return self.generation.abi3

    @abstractmethod
    def wheel_flags(self, entry: Entry, *, index_url: str) -> list[tuple[str, ...]]:
        """Its part of the builder's ``wheel`` command: what to compile (each tuple one line of a Dockerfile)."""

    @abstractmethod
    def work(self, entry: Entry) -> Work:
        """What its build job compiles, for the runner-fit estimate."""

    def summary(self) -> dict[str, Any]:
        """Its settings in ``plan --json``."""
        return {}

    def labels(self, entry: Entry, runtime: tuple[str, ...]) -> dict[str, str]:
        """The image labels it adds (``fa-images.generation``, what it compiled); ``runtime``: the
        pinned set its install stage installs."""
        return {}

    def runtime_pins(self) -> tuple[str, ...]:
        """What it installs beside torch besides the table's runtime dependencies, pinned."""
        return ()

    def install_stage(self, entry: Entry, runtime: tuple[str, ...]) -> InstallStage:
        """The image's install stage: its wheel, installed and checked."""
        return WHEEL_INSTALL

    def notes(self, entry: Entry) -> list[str]:
        """What ``plan`` says of the entry's generation, besides its line."""
        return []

    def shard_problem(self) -> str | None:
        """Why its compile is never split into shards, or None."""
        return None

    def farm_problem(self) -> str | None:
        """Why a build farm (the Slurm export) cannot build it, or None."""
        return None

    def source_name(self, version: str) -> str:
        from ...builder import source

        return source.sdist_name(version)


@dataclass(frozen=True)
class Section:
    """A generation's own section of matrix.yaml (``fa3:``): what every entry of it shares."""

    key: str
    settings: type  # the frozen settings it parses into, validated in their __post_init__
    fields: dict[str, Any]  # each key's shape: a list of one type ([int]) or one type (int)
    example: str
    about: str  # for the schema


@dataclass(frozen=True)
class Versions:
    """The versions of one combination, each None where it was missing or bad (already said)."""

    python: str | None
    torch: str | None
    flash_attn: str | None
    cuda: str | None  # None where the combination gives none

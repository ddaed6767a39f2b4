"""A stand-in generation, FlashAttention-9, defined only here: what docs/architecture.md says a new
generation writes, and nothing else. ``registered`` (test_standin_generation.py) adds it to both
registries; plan, render and the builder's prepare then take it as they take the real ones.

One module plays both parts a real generation has: its host module (GENERATION, SECTION, TABLE,
STARTER, class_of, resolve and its Recipe) and its builder module (the steps.Steps functions).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fa_images.builder.errors import UsageError
from fa_images.builder.generations import Generation
from fa_images.builder.generations.steps import PreparedSource, SourceRequest
from fa_images.builder.source import SourceTree
from fa_images.config.generations import Recipe, Section, Versions, Work

GENERATION = Generation(
    number=9,
    project="flash-attn-9",
    package="flash_attn_9",
    extension_module="flash_attn_9._C",
    extension_member="flash_attn_9/_C.",
    abi3=True,
    source="archive",
    own_module="flash_attn_9",
    steps_module=__name__,  # a dotted path: its builder module is this one
)


@dataclass(frozen=True)
class Fa9Knobs:
    """Its own settings: one tile size."""

    tile: int = 128

    def __post_init__(self) -> None:
        if self.tile not in (64, 128, 256):
            raise UsageError(f"FA9 tile {self.tile}: of 64, 128, 256")


SECTION = Section(key="fa9", settings=Fa9Knobs, fields={"tile": int}, example="e.g. fa9: {tile: 64}", about="FA9")
TABLE = None
STARTER = ""


def class_of(compat: Any, gpu: str) -> str:
    return ""


def _label(cuda: str | None, tile: int) -> str:
    return f"cu{(cuda or '0').split('.')[0]}.t{tile}"


@dataclass(frozen=True)
class Fa9Recipe(Recipe):
    generation = GENERATION
    source = "archive"
    knobs: Fa9Knobs

    def wheel_label(self, entry: Any) -> str:
        return _label(entry.cuda, self.knobs.tile)

    def wheel_labels(self, entry: Any) -> set[str]:
        return {self.wheel_label(entry)}

    def compile_group(self, entry: Any) -> str:
        return f"fa{entry.flash_attn}-{self.wheel_label(entry)}"

    def wheel_flags(self, entry: Any, *, index_url: str) -> list[tuple[str, ...]]:
        return [("--fa9-tile", str(self.knobs.tile))]

    def work(self, entry: Any) -> Work:
        return Work(600.0, 1, 0.0, "compiles FA9's one kernel")

    def summary(self) -> dict[str, Any]:
        return {"fa9": {"tile": self.knobs.tile}}

    def labels(self, entry: Any, runtime: tuple[str, ...]) -> dict[str, str]:
        return {"fa-images.generation": "9", "fa-images.fa9-tile": str(self.knobs.tile)}

    def source_name(self, version: str) -> str:
        return f"flash_attn_9-{version}.tar.gz"


def resolve(resolver: Any, combo: Any, v: Versions, before: int) -> Any:
    """A FlashAttention-9 entry: any torch and CUDA the table has, its one kernel for sm_90a."""
    knobs = resolver.settings_of(SECTION)
    if "target" not in combo.values:
        resolver.fail(combo, None, "no target: name the GPUs it is for")
        return None
    found = resolver.target_gpus(combo, GENERATION.name)
    resolver.check_python(combo, v.python)
    release, cuda, _ = resolver.torch_release(combo, v.python, v.torch, v.cuda)
    cuda_rel = resolver.cuda_release(combo, cuda, v.torch)
    if len(resolver.problems) > before or not (found and v.python and v.torch and v.flash_attn and cuda and cuda_rel):
        return None
    gpus = tuple(gpu for gpu, _cc, _arch in found)
    return resolver.made(
        combo, v, cuda=cuda, cuda_rel=cuda_rel, archs=("90a",), ptx=False, gpus=gpus, release=release, sha256=None,
        recipe=Fa9Recipe(knobs),
    )  # fmt: skip


# --- its builder module (steps.Steps) -------------------------------------------------------------

LABEL = re.compile(r"cu(?P<cuda>\d+)\.t(?P<tile>\d+)")
FLAGS = ("fa9_tile",)


def label(local: str) -> re.Match[str] | None:
    return LABEL.fullmatch(local)


def add_wheel_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fa9-tile", type=int, metavar="N", help="FlashAttention-9's tile")


def add_commands(sub: argparse._SubParsersAction) -> None:
    """None of its own."""


def from_flags(args: argparse.Namespace) -> tuple[dict[str, Any] | None, tuple[str, ...]]:
    return {"tile": Fa9Knobs(args.fa9_tile or 128).tile}, ()


def prepare_source(request: SourceRequest, torch: Any) -> PreparedSource:
    """Its source is its own business: here, a tree it writes."""
    version = request.version or "9.0.0"
    tree_dir = request.work_dir / "src" / f"flash_attn_9-{version}"
    tree_dir.mkdir(parents=True)
    (tree_dir / "setup.py").write_text("raise SystemExit('a stand-in: nothing to compile')\n")
    tree = SourceTree(tree_dir, version, request.work_dir / "none.tar.gz", "0" * 64, False, True)
    tile = Fa9Knobs(**(request.knobs or {})).tile
    return PreparedSource(tree, ("90a",), _label(torch.cuda, tile), ptx=False, knobs=request.knobs)


def setup_command(python: str, src: Path, dist: Path, settings_file: Path) -> list[str]:
    return [python, "setup.py", "bdist_wheel", "--dist-dir", str(dist)]


def setup_environment(settings: Any, nvcc: Any) -> dict[str, str]:
    return {"FA9_TILE": str((settings.knobs or {}).get("tile", 128))}


def check_wheel(report: Any, wheel: Any) -> None:
    report.add("FA9 build", "pass", "one kernel")


def check_label(report: Any, match: re.Match[str] | None, torch_here: dict) -> None:
    report.add("label", "pass" if match else "skip", "cuNN.tN")

"""What several commands share: the matrix arguments, the pull policy and GPU flags, loading the
matrix, and the warning of a source archive a build would not find."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..builder.wording import counted
from ..config.grammar import PULL_POLICIES
from ..run.gpus import MODES as GPU_MODES
from ..run.logger import say


def matrix_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--matrix",
        type=Path,
        default=Path("matrix.yaml"),
        metavar="FILE",
        help="the build matrix (default: ./matrix.yaml)",
    )
    parser.add_argument(
        "--compat",
        type=Path,
        default=None,
        metavar="FILE",
        help="extra compatibility data merged over the built-in table (new torch releases, GPUs)",
    )


def pull_arg(parser: argparse.ArgumentParser, *, default: str | None, when: str, note: str, never: str) -> None:
    """``--pull``, as ``build`` and ``check`` take it: when the images they start from are pulled."""
    parser.add_argument(
        "--pull",
        choices=PULL_POLICIES,
        default=default,
        help=f"when to pull the images, {when}: missing = those the engine lacks {note}, always = every one "
        f"(refreshes a moving tag), never = refuse a missing one (exit 3{'; ' + never if never else ''})",
    )


def gpus_arg(parser: argparse.ArgumentParser, *, runtime: str, none: str, default: str = "runtime") -> None:
    """``--gpus``, as ``build`` and ``check`` take it: how the GPU check's container gets the GPUs."""
    parser.add_argument(
        "--gpus",
        choices=GPU_MODES,
        default=default,
        help=f"how the GPU check's container gets the GPUs: runtime = the engine's NVIDIA Container Toolkit "
        f"{runtime}, devices = pass /dev/nvidia* and the host's driver libraries explicitly (no toolkit "
        f"needed; exit 3 if the host has none), none = {none}",
    )


def load(args: argparse.Namespace):
    from ..config import matrix

    return matrix.load(args.matrix, compat_override=args.compat)


def warn_unfound_archives(m, entries) -> None:
    """Entries a build and every export would refuse for a missing source archive, said now."""
    unfound = m.unfound_archives(entries)
    if unfound:
        lines = "; ".join(unfound)
        fix = "`fa-images source --help` says how to make it; packages.sdists: DIR finds it"
        count = counted(len(unfound), "entry")
        say(f"warning: {count} without a source archive, which build and the exports refuse: {lines} ({fix})",
            out=sys.stderr)  # fmt: skip

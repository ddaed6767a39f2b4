"""``inventory``: the Python distributions and CUDA libraries installed here, as one JSON line (an image's SBOM)."""

from __future__ import annotations

import argparse

from .. import inventory


def add(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "inventory",
        help="print the Python packages and CUDA libraries installed here, as JSON (for an image's SBOM)",
        description=inventory.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(func=run)


def run(_args: argparse.Namespace) -> int:
    print(inventory.line())
    return 0

"""``fa-images source GENERATION``: a source archive no index serves, made from local clones, one
subcommand per generation that needs one (commands/generations/)."""

from __future__ import annotations

import argparse

from . import generations


def add(sub: argparse._SubParsersAction) -> None:
    src = sub.add_parser(
        "source",
        help="make a source archive no index serves ("
        + ", ".join(m.GENERATION_NAME for m in generations.SOURCES)
        + ")",
        epilog=generations.SOURCES[0].EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src_sub = src.add_subparsers(dest="source_command", required=True, metavar="GENERATION")
    for module in generations.SOURCES:
        module.add(src_sub)

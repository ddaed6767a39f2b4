"""``check``: the flash-attn installed here imported and compared with a reference on the GPU (gpucheck.py)."""

from __future__ import annotations

import argparse

from .. import gpucheck


def add(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = sub.add_parser(
        "check",
        help="import flash-attn and compare it with SDPA on the GPU",
        description=gpucheck.__doc__,
        formatter_class=fmt,
    )
    parser.add_argument("--import-only", action="store_true", help="only the import check (no GPU needed)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return gpucheck.run(import_only=args.import_only)

"""``inspect``: whether a wheel is sound (tags, extension, ABI, GPU archs, import), as verify.py checks it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import verify
from .wheel import archs

EXAMPLES = """\
examples:
  fa-images inspect dist/flash_attn-2.8.3+cu128torch2.9cxx11abitrue-cp312-cp312-linux_x86_64.whl
  fa-images inspect WHEEL --archs 80,90 --json

The import check loads the wheel's compiled extension next to torch: that runs code from
the wheel. Inspect a wheel you do not trust with --no-import (tags, metadata, ABI and GPU
archs are read from the files without running anything), or in a throwaway container.

Exit status: 0 when the wheel is sound, 1 with every reason when it is not, 2 when the
file is not a readable wheel.

protected: the wheel is read as a regular file only (never a FIFO or device); the extension
is extracted bounded by its declared and its real size; its name, METADATA and symbols are
printed escaped. A --python that is missing or lies is a finding, not a crash.
"""


def add(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    insp = sub.add_parser(
        "inspect",
        help="check that a wheel is sound: tags, extension, ABI, GPU archs, import",
        epilog=EXAMPLES,
        formatter_class=fmt,
    )
    insp.add_argument("wheel", type=Path)
    insp.add_argument("--archs", type=archs, metavar="LIST", help="require cubins for these archs")
    insp.add_argument(
        "--python",
        default=sys.executable,
        metavar="EXE",
        help="interpreter whose torch the import check uses (default: this one)",
    )
    insp.add_argument(
        "--no-import",
        dest="import_check",
        action="store_false",
        help="skip the import check: importing a wheel runs its code, so use this for a wheel you do not trust",
    )
    insp.add_argument("--json", action="store_true")
    insp.set_defaults(func=run)
    return insp


def run(args: argparse.Namespace) -> int:
    report = verify.inspect_wheel(
        args.wheel, expect_archs=args.archs, python=args.python, import_check=args.import_check
    )
    print(report.to_json() if args.json else "\n".join(report.lines()))
    return 0 if report.ok else 1

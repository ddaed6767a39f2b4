"""``fa-images gpus``: every GPU and AWS instance family, the arch each needs, and what a matrix runs on."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..run.logger import say
from . import common

EXAMPLES = """\
examples:
  fa-images gpus                         every GPU and AWS instance family, and the arch it needs
  fa-images gpus --matrix matrix.yaml    ... and which entries run on each; the GPUs none runs on
  fa-images gpus --json                  one object per GPU

A GPU runs a flash-attn 2 wheel that holds kernels of its major arch (sm_80 serves every 8.x GPU:
A10G on g5, L4 on g6, L40S on g6e), or PTX of an older arch. An instance family is a `target`
name as its GPU is (`target: [g5, g6e, g7e]`); aarch64 (Grace) families are listed, not built.
"""


def run(args: argparse.Namespace) -> int:
    from ..config import compat as compat_mod
    from ..config import fleet

    if args.matrix is not None:
        m = common.load(args)
        table, entries = m.compat, m.entries
    else:
        table, entries = compat_mod.load(*([args.compat] if args.compat else [])), None
    rows = fleet.rows(table, entries)
    if args.json:
        print(json.dumps([r.summary() for r in rows], indent=2))
        return 0
    columns = "{:<12} {:<8} {:<17} {:<32} {}"
    say(
        columns.format(
            "GPU", "compute", "flash-attn 2 arch", "AWS instance families", "entries" if entries else ""
        ).rstrip()
    )
    for r in rows:
        families = ", ".join(f"{f} (aarch64, not built)" if f in r.aarch64 else f for f in r.families)
        runs = "" if r.runs is None else str(len(r.runs)) if r.arch else "-"
        say(columns.format(r.gpu, r.capability, r.need, families or "-", runs).rstrip())
    for name, gpus in sorted(table.targets.items()):
        say(f"target {name}: {', '.join(gpus)}")
    if entries is not None:
        covered, missed = fleet.families(rows)
        say(f"{args.matrix} runs on {', '.join(covered) or 'no instance family'}")
        if missed:
            say(f"and not on {', '.join(missed)} (the entries column says which GPUs)")
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    gpus = sub.add_parser(
        "gpus",
        help="list the GPUs and AWS instance families, the arch each needs, and what a matrix covers",
        epilog=EXAMPLES,
        formatter_class=fmt,
    )
    gpus.add_argument("--matrix", type=Path, metavar="FILE", help="also say which of its entries run on each GPU")
    gpus.add_argument(
        "--compat", type=Path, metavar="FILE", help="extra compatibility data merged over the built-in table"
    )
    gpus.add_argument("--json", action="store_true", help="print a JSON array, one object per GPU")
    gpus.set_defaults(func=run)

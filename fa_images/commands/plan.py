"""``fa-images plan``: the entries a matrix expands to, what each generation builds, what is left out."""

from __future__ import annotations

import argparse
import json
import sys

from ..builder.wording import counted
from ..run.logger import say
from . import common

EXAMPLES = """\
examples:
  fa-images plan                         the entries of ./matrix.yaml, one line each
  fa-images plan --matrix ci.yaml --json a JSON array: id, python, torch, cuda, flash_attn, archs, image, ...

protected: the matrix and compat files are read as regular files, bounded (1 MiB, 64 levels,
100,000 values, UTF-8), and every value is checked against its grammar; nothing is written.
"""


def run(args: argparse.Namespace) -> int:
    m = common.load(args)
    entries = m.entries
    # What each rule of the matrix resolved to, and what the table has no build of: on stderr
    # with --json, whose stdout is the entries alone.
    notes = [f"matrix.{r.axis} {r} resolves to {', '.join(r.values)}" for r in m.rules]
    left_out = list(dict.fromkeys(f"left out {lo.combination}: {lo.reason}" for lo in m.left_out))
    for note in notes + left_out:
        say(note, out=sys.stderr if args.json else None)
    common.warn_unfound_archives(m, entries)
    if args.json:
        print(json.dumps([e.summary() for e in entries], indent=2))
        return 0
    width = max(len(e.id) for e in entries)
    for e in entries:
        abi = {True: "new ABI", False: "old ABI", None: "ABI ?"}[e.cxx11_abi]
        covers = f"  for {', '.join(e.gpus)}" if e.gpus else ""
        archs = ",".join(e.archs) + ("+PTX" if e.ptx else "")  # PTX of the newest arch, for newer GPUs
        say(f"{e.id:<{width}}  archs {archs:<7} {abi:<8} {e.image}{covers}")
        if e.cuda_note:
            say(f"{'':<{width}}  {e.cuda_note}")
    for note in dict.fromkeys(note for e in entries for note in e.recipe.notes(e)):  # a group's once
        say(note)
    groups = len({e.compile_group for e in entries})
    also = f"; {counted(len(left_out), 'combination')} left out" if left_out else ""
    say(f"{counted(len(entries), 'entry')} in {counted(groups, 'compile group')} (entries that share kernels){also}")
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    plan = sub.add_parser("plan", help="show the entries the matrix expands to", epilog=EXAMPLES, formatter_class=fmt)
    common.matrix_args(plan)
    plan.add_argument("--json", action="store_true", help="print a JSON array")
    plan.set_defaults(func=run)

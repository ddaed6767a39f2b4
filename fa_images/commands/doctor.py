"""``fa-images doctor``: this machine, its flash-attn and the entry that fits it."""

from __future__ import annotations

import argparse
import sys

EXAMPLES = """\
examples:
  fa-images doctor                       this machine: torch, CUDA, ABI, GPUs, an installed flash-attn
  fa-images doctor --python .venv/bin/python --json
exit codes: 0 all is well, 1 something is broken (each reason printed with its fix)

protected: every probe runs in a child process: a Python that is missing or lies about itself,
a torch whose import exits quietly or has no version, and nvidia-smi lines of another shape are
reported as findings, never a crash; what they print is escaped before it reaches the terminal.
"""


def run(args: argparse.Namespace) -> int:
    from .. import doctor

    return doctor.main(python=args.python, as_json=args.json)


def add(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    doctor = sub.add_parser(
        "doctor",
        help="explain this machine: what flash-attn needs here, what is broken, what to build",
        epilog=EXAMPLES,
        formatter_class=fmt,
    )
    doctor.add_argument("--python", default=sys.executable, metavar="PATH", help="the Python to examine")
    doctor.add_argument("--json", action="store_true", help="one JSON object")
    doctor.set_defaults(func=run)

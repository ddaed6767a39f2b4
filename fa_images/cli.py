"""The ``fa-images`` command line.

Heavy modules (jinja2, yaml, the docker SDK) are imported inside the commands that need
them, so ``fa-images wheel`` also runs where only torch and packaging are installed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import __version__
from .builder import cli as builder_cli

DESCRIPTION = """\
Build flash-attn wheels and images that are right for one exact Python, torch and CUDA.

  fa-images plan                     show what the matrix expands to
  fa-images render                   write dockerfiles/<id>.Dockerfile
  fa-images build                    build, check and export every entry (needs Docker)
  fa-images wheel --flash-attn 2.8.3 build a wheel natively, next to the installed torch
  fa-images inspect WHEEL            check a wheel: tags, extension, ABI, GPU archs, import
"""


PLAN_EXAMPLES = """\
examples:
  fa-images plan                         the entries of ./matrix.yaml, one line each
  fa-images plan --matrix ci.yaml --json a JSON array: id, python, torch, cuda, flash_attn, archs, image, ...
"""

RENDER_EXAMPLES = """\
examples:
  fa-images render                       write dockerfiles/<id>.Dockerfile for ./matrix.yaml
  fa-images render --out build/df       somewhere else
  fa-images render --check               exit 1 and name the files that are stale (for CI)
"""


def _matrix_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--matrix", type=Path, default=Path("matrix.yaml"), metavar="FILE",
                        help="the build matrix (default: ./matrix.yaml)")
    parser.add_argument("--compat", type=Path, metavar="FILE",
                        help="extra compatibility data merged over the built-in table (new torch releases, GPUs)")


def _load(args: argparse.Namespace):
    from . import matrix

    return matrix.load(args.matrix, compat_override=args.compat)


def cmd_plan(args: argparse.Namespace) -> int:
    entries = _load(args).entries
    if args.json:
        print(json.dumps([e.summary() for e in entries], indent=2))
        return 0
    width = max(len(e.id) for e in entries)
    for e in entries:
        abi = {True: "new ABI", False: "old ABI", None: "ABI ?"}[e.cxx11_abi]
        print(f"{e.id:<{width}}  archs {','.join(e.archs):<7} {abi:<8} {e.image}")
    print(f"{len(entries)} entries")
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    from . import render

    m = _load(args)
    result = render.render_all(m, m.entries, args.out, check=args.check)
    if args.check:
        for path in result.stale:
            print(f"stale: {path}")
        for path in result.extra:
            print(f"not in the matrix: {path}")
        if result.stale or result.extra:
            print(f"{args.out} is out of date: run `fa-images render --matrix {args.matrix}`", file=sys.stderr)
            return 1
        print(f"{args.out}: {len(m.entries)} Dockerfiles up to date")
        return 0
    for path in result.written:
        print(f"wrote {path}")
    for path in result.extra:
        print(f"note: {path} is not rendered by this matrix; delete it if it is no longer wanted")
    print(f"{len(m.entries)} Dockerfiles in {args.out} ({len(result.written)} changed)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fa-images", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"fa-images {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    fmt = argparse.RawDescriptionHelpFormatter
    plan = sub.add_parser("plan", help="show the entries the matrix expands to", epilog=PLAN_EXAMPLES, formatter_class=fmt)
    _matrix_args(plan)
    plan.add_argument("--json", action="store_true", help="print a JSON array")
    plan.set_defaults(func=cmd_plan)

    render = sub.add_parser("render", help="write one Dockerfile per entry", epilog=RENDER_EXAMPLES, formatter_class=fmt)
    _matrix_args(render)
    render.add_argument("--out", type=Path, default=Path("dockerfiles"), metavar="DIR", help="default: dockerfiles/")
    render.add_argument("--check", action="store_true", help="write nothing; exit 1 if DIR is stale")
    render.set_defaults(func=cmd_render)

    builder_cli.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return builder_cli.run_command(args)


if __name__ == "__main__":
    sys.exit(main())

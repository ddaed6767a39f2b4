"""``fa-images render``: one Dockerfile per entry, or ``--check`` that they are up to date."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..builder.wording import counted
from ..run.logger import say
from . import common

EXAMPLES = """\
examples:
  fa-images render                       write dockerfiles/<id>.Dockerfile for ./matrix.yaml
  fa-images render --out build/df       somewhere else
  fa-images render --check               exit 1 and name the files that are stale (for CI)

protected: every value is checked against its grammar before a file is written; DIR and each
<id>.Dockerfile are written atomically and never through a symlink (a planted link is an
error, not followed); nothing is ever deleted.
"""


def run(args: argparse.Namespace) -> int:
    from ..builder.untrusted import shown
    from ..outputs import render

    m = common.load(args)
    common.warn_unfound_archives(m, m.entries)
    form = m.build.decide_builder(args.builder, host=None).form  # the files never depend on this host
    result = render.render_all(m, m.entries, args.out, check=args.check, builder=form)
    if args.check:  # the files found in --out are named escaped, newlines too: any name can be there
        for path in result.stale:
            say(f"stale: {shown(str(path))}")
        for path in result.extra:
            say(f"not in the matrix: {shown(str(path))}")
        if result.stale or result.extra:
            again = f"fa-images render --matrix {args.matrix}" + (f" --builder {args.builder}" if args.builder else "")
            again += f" --out {args.out}" if args.out != Path("dockerfiles") else ""
            say(f"{args.out} is out of date: run `{again}`", out=sys.stderr)
            return 1
        say(f"{args.out}: {counted(len(m.entries), 'Dockerfile')} up to date")
        return 0
    for path in result.written:
        say(f"wrote {path}")
    for path in result.extra:
        say(f"note: {shown(str(path))} is not rendered by this matrix; delete it if it is no longer wanted")
    say(f"{counted(len(m.entries), 'Dockerfile')} in {args.out} ({len(result.written)} changed)")
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    render = sub.add_parser("render", help="write one Dockerfile per entry", epilog=EXAMPLES, formatter_class=fmt)
    common.matrix_args(render)
    render.add_argument("--out", type=Path, default=Path("dockerfiles"), metavar="DIR", help="default: dockerfiles/")
    render.add_argument("--check", action="store_true", help="write nothing; exit 1 if DIR is stale")
    render.add_argument(
        "--builder",
        choices=("buildkit", "sdk"),
        help="the form to write: buildkit (RUN --mount: the torch venv mounted, not copied; a cache mount for "
        "the compiler cache) or sdk (no BuildKit syntax; the legacy builder builds it). Default: the form of the "
        "matrix's build.builder: sdk for sdk (and for auto with build.memory, which needs it), else buildkit, "
        "which auto takes on any Docker Engine whose CLI has it; the files never depend on this host",
    )
    render.set_defaults(func=run)

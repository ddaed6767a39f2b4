"""``fa-images compat refresh``: the compat table's generated blocks from the indexes."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..builder import safe_io
from ..run.logger import say

EXAMPLES = """\
examples:
  fa-images compat refresh                       the built-in table, refreshed from PyPI and torch, into ./compat.yaml
  fa-images compat refresh --matrix matrix.yaml  ... into the file the matrix's compat: names
  fa-images compat refresh --out new.yaml --pypi https://mirror.local/simple
  fa-images compat refresh --json                what changed as one JSON object, for CI

It prints what changed against --table: each torch release and flash-attn sdist added or
removed, each release whose CUDA variants, C++ ABI, CUDA library pins, Pythons or default CUDA
changed, then a count.
Exit status: 0 written, no release changed; {changed} written, and some changed (not an
error: CI can rebuild or open a pull request); 2 bad input (an index page, a flag, a hash that
disagrees), nothing written.

protected: index pages are read with a size cap (64 MiB) and a time cap, as UTF-8; a link must
keep its page's scheme and host (an https link may go to another host, as PyPI's do; never
file://). The new table is checked in full, its values written by a serializer, and renamed
over --out only then: a refusal or a failure leaves --out as it was. --out is never a link.
"""


def cmd_compat_refresh(args: argparse.Namespace) -> int:
    from ..config import compat, compatgen, grammar
    from ..errors import EXIT_TABLE_CHANGED, UsageError

    for name in ("pypi", "torch_index"):
        problem = grammar.index_url(getattr(args, name))
        if problem:
            raise UsageError(f"--{name.replace('_', '-')} {problem}")
    table = args.table or compat.DEFAULT_FILE
    out = args.out or args.table or _refreshed_table_file(args.matrix)
    package = Path(compat.__file__).resolve().parents[1]
    if out.resolve().is_relative_to(package):  # an upgrade of fa-images would undo it, silently
        raise UsageError(
            f"--out {out} is inside fa-images's installed package ({package}); fa-images never writes there",
            hint="write ./compat.yaml (the default) and name it with the matrix's compat: or --compat",
        )
    # The output's folder is checked before any index is asked; the text is validated in full
    # (compatgen.refresh) before it replaces the file, by a rename: a refusal leaves it as it was.
    target = safe_io.OutputDir(out.parent, what="--out's folder")
    if target.kind(out.name) not in (None, "file"):
        kind = {"dir": "directory", "link": "symlink"}.get(target.kind(out.name) or "", "special file")
        raise UsageError(f"--out {out} must be a file, not a {kind} (fa-images does not write through links)")
    result = compatgen.refresh(table, pypi=args.pypi, torch_index=args.torch_index, min_torch=args.min_torch)
    target.write_text(out.name, result.text)

    status = EXIT_TABLE_CHANGED if result.diff.changed else 0
    if args.json:  # json.dumps escapes every control character the indexes could send
        print(json.dumps({**result.diff.as_json(), "notes": result.notes, "wrote": str(out)}, indent=2))
        return status
    for line in [*result.notes, *result.diff.lines()]:  # they quote what the indexes published
        say(line)
    say(f"wrote {out}")
    return status


def _refreshed_table_file(matrix_file: Path | None) -> Path:
    """Where `compat refresh` writes by default: the matrix's compat: file, or ./compat.yaml."""
    from ..config import matrix

    named = matrix.compat_file_of(matrix_file) if matrix_file else None
    return named or Path("compat.yaml")


def add(sub: argparse._SubParsersAction) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    from ..errors import EXIT_TABLE_CHANGED

    compat_examples = EXAMPLES.format(changed=EXIT_TABLE_CHANGED)
    comp = sub.add_parser("compat", help="the compatibility table", epilog=compat_examples, formatter_class=fmt)
    comp_sub = comp.add_subparsers(dest="compat_command", required=True, metavar="COMMAND")
    refresh = comp_sub.add_parser(
        "refresh",
        help="refresh torch releases and flash-attn sdists from the indexes",
        epilog=compat_examples,
        formatter_class=fmt,
    )
    refresh.add_argument("--table", type=Path, metavar="FILE", help="the table to refresh (default: the built-in)")
    refresh.add_argument(
        "--out",
        type=Path,
        metavar="FILE",
        help="where to write it (default: over --table; for the built-in, the --matrix's compat: file, "
        "else ./compat.yaml; never inside the installed package)",
    )
    refresh.add_argument("--matrix", type=Path, metavar="FILE", help="write to the compat: file this matrix names")
    refresh.add_argument(
        "--pypi", default="https://pypi.org/simple", metavar="URL", help="a simple index (PEP 691 JSON or PEP 503 HTML)"
    )
    refresh.add_argument(
        "--torch-index", default="https://download.pytorch.org/whl", metavar="URL", help="torch's variant index"
    )
    refresh.add_argument("--min-torch", default="2.4.0", metavar="VERSION", help="the oldest torch to list")
    refresh.add_argument(
        "--json", action="store_true", help="what changed, the notes and the file written, as one JSON object"
    )
    refresh.set_defaults(func=cmd_compat_refresh)

"""``fa-images inspect``: the builder's wheel inspection, and on the host ``--verify``: its signed
attestations checked before anything of the wheel runs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..builder.commands import inspect as builder_inspect

VERIFY = """
--verify KEY.pub (before the import check, which runs the wheel's code): the attestations beside
the wheel (WHEEL.intoto.jsonl, as `build --sign-key` writes it) must each be signed by that key and
be about this very file (its sha256). Then their verdicts are shown: which GPU passed, with which
driver, and when. Exit status 13 when the wheel is not signed, 14 when a signature does not match
(another key, or a statement changed after signing), 15 when a statement is about another file.
"""


def add(sub: argparse._SubParsersAction) -> None:
    parser = builder_inspect.add(sub)
    parser.epilog = (parser.epilog or "") + VERIFY
    parser.add_argument(
        "--verify",
        type=Path,
        metavar="KEY.pub",
        help="first check the wheel's signed attestations (WHEEL.intoto.jsonl) against this public key",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.verify is None:
        return builder_inspect.run(args)
    from ..outputs import signing
    from ..run import attested

    found = attested.verify_wheel(args.wheel, signing.load_public(args.verify))  # refused: nothing runs
    if not args.json:
        for line in found.lines():
            print(line)
        return builder_inspect.run(args)
    from ..builder.verify import inspect_wheel

    report = inspect_wheel(args.wheel, expect_archs=args.archs, python=args.python, import_check=args.import_check)
    print(json.dumps(json.loads(report.to_json()) | {"attestations": found.to_dict()}, indent=2))
    return 0 if report.ok else 1

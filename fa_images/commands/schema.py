"""``fa-images schema``: the JSON schema of ``matrix.yaml``, for editors and CI."""

from __future__ import annotations

import argparse
import sys

EXAMPLES = """\
examples:
  fa-images schema > matrix.schema.json      the schema, for an editor beside matrix.yaml
  check-jsonschema --schemafile matrix.schema.json matrix.yaml

An editor with the YAML language server reads it from the first line of matrix.yaml
(`fa-images init` writes that line):  # yaml-language-server: $schema=matrix.schema.json
The schema checks the shape of the file (its keys, which values are lists, strings or numbers);
`fa-images plan` checks every value against the compat table and its grammar.
The package ships the same file: fa_images/config/matrix.schema.json.
"""


def add(sub: argparse._SubParsersAction) -> None:
    schema = sub.add_parser(
        "schema",
        help="print the JSON schema of matrix.yaml",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    schema.set_defaults(func=run)


def run(_args: argparse.Namespace) -> int:
    from ..config import schema

    sys.stdout.write(schema.text())
    return 0

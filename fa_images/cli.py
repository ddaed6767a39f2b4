"""The ``fa-images`` command line.

Heavy modules (jinja2, yaml, the docker SDK) are imported inside the commands that need
them, so ``fa-images wheel`` also runs where only torch and packaging are installed.
"""

from __future__ import annotations

import argparse
import sys

from . import __version__
from .builder import cli as builder_cli
from .commands import (
    build,
    check,
    compat,
    dist,
    doctor,
    export,
    gpus,
    init,
    inspect,
    keys,
    pick,
    plan,
    render,
    schema,
    source,
)

DESCRIPTION = """\
Build flash-attn wheels and images that are right for one exact Python, torch and CUDA.

  fa-images init                     write a commented starter matrix.yaml for this machine
  fa-images plan                     show what the matrix expands to
  fa-images render                   write dockerfiles/<id>.Dockerfile
  fa-images build                    build, check and export every entry (needs Docker)
  fa-images wheel --flash-attn 2.8.3 build a wheel natively, next to the installed torch
  fa-images inspect WHEEL            check a wheel: tags, extension, ABI, GPU archs, import
  fa-images keys create keys/        a key pair that signs what build makes (build --sign-key)
  fa-images doctor                   explain this machine: what is broken, what to build
  fa-images check IMAGE              pull an image and run its GPU check on this node's GPU
  fa-images pick g5                  the image and wheel a node takes, by its GPU or instance family
  fa-images schema                   the JSON schema of matrix.yaml, for editors
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fa-images", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"fa-images {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in (plan, gpus, render, build, dist, export, doctor, init, compat, source, pick, schema, keys):
        command.add(sub)
    builder_cli.add_commands(sub, host=True)  # the builder's own, and those its generations add
    inspect.add(sub)
    check.add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return builder_cli.run_command(args)


if __name__ == "__main__":
    sys.exit(main())

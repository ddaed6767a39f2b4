"""The ``fa-images`` command line.

Heavy modules (jinja2, yaml, the docker SDK) are imported inside the commands that need
them, so ``fa-images wheel`` also runs where only torch and packaging are installed.
"""

from __future__ import annotations

import argparse
import sys
from importlib import import_module

from . import __version__
from .builder import cli as builder_cli

# The host's commands in the order --help lists them, each added by its module of fa_images.commands;
# BUILDER stands for the builder's own (wheel, and those its generations add). A command line that
# starts with one of these names builds that command's parser alone: it imports what that command
# needs, not what every command needs (a tenth of a second or more of imports per command run).
BUILDER = ""
COMMANDS = (
    "plan", "gpus", "render", "build", "dist", "export", "doctor", "init", "compat", "source", "pick", "schema",
    "keys", BUILDER, "inspect", "check",
)  # fmt: skip

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


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; or, for ``command`` (one of COMMANDS), a parser that knows that command
    alone and parses its command lines as the whole one does."""
    parser = argparse.ArgumentParser(
        prog="fa-images", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"fa-images {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in (command,) if command in COMMANDS and command != BUILDER else COMMANDS:
        if name == BUILDER:
            builder_cli.add_commands(sub, host=True)
        else:
            import_module(f"{__package__}.commands.{name}").add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    return builder_cli.run_command(args)


if __name__ == "__main__":
    sys.exit(main())

"""`fa-images COMMAND ...` builds the parser of that command alone (fa_images/cli.py): it must read
and explain every command line as the whole parser does, and import no other command's module."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from fa_images import cli
from fa_images.builder import cli as builder_cli

NAMED = [name for name in cli.COMMANDS if name != cli.BUILDER]


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def _helps(parser: argparse.ArgumentParser, path: str = "") -> dict[str, str]:
    """Every parser under ``parser`` by its command path, with its whole --help."""
    helps = {path: parser.format_help()}
    if any(isinstance(a, argparse._SubParsersAction) for a in parser._actions):
        for name, child in _commands(parser).items():
            helps.update(_helps(child, f"{path} {name}".strip()))
    return helps


@pytest.mark.parametrize("name", NAMED)
def test_a_commands_own_parser_is_the_whole_parsers(name: str) -> None:
    whole = _helps(_commands(cli.build_parser())[name], name)
    alone = _commands(cli.build_parser(name))
    assert list(alone) == [name]
    assert _helps(alone[name], name) == whole


def test_the_whole_parser_holds_the_named_commands_and_the_builders_own() -> None:
    builders = argparse.ArgumentParser().add_subparsers()
    builder_cli.add_commands(builders, host=True)
    assert list(_commands(cli.build_parser())) == [
        *NAMED[: cli.COMMANDS.index(cli.BUILDER)],
        *builders.choices,
        *NAMED[cli.COMMANDS.index(cli.BUILDER) :],
    ]
    # Any other first word (an option, a builder command, a typo) takes the whole parser.
    assert list(_commands(cli.build_parser("wheel"))) == list(_commands(cli.build_parser()))


def test_a_command_line_imports_its_own_command_only() -> None:
    probe = (
        "import sys; from fa_images import cli; cli.build_parser('schema');"
        "print(' '.join(m for m in sys.modules if m.startswith(('fa_images.commands.', 'fa_images.builder.commands'))))"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert proc.stdout.split() == ["fa_images.commands.schema"], proc.stdout

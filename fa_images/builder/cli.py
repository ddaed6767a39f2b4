"""Command line of the builder: ``wheel``, ``inspect`` and ``check``.

The same parsers serve ``python -m fa_images.builder`` inside images and ``fa-images``
on the host (which mounts them with ``add_commands``), so the two cannot drift.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import signal
import sys
import threading
import traceback

from .errors import EnvironmentProblem, FatalError, UsageError
from .untrusted import shown


def add_commands(sub: argparse._SubParsersAction, *, host: bool = False) -> None:
    """The builder's commands, and those its generations add; ``host``: the host mounts its own
    ``check`` (images on a node, or this machine's check) and ``inspect`` (with ``--verify``).
    Their modules are imported here, not above: ``fa-images`` runs commands through this module
    and imports a command's callers only when it runs that command."""
    from . import generations
    from .commands import check as check_command
    from .commands import inspect, inventory, wheel

    wheel.add(sub)
    for gen in generations.GENERATIONS:  # the commands a generation adds (compiling ahead)
        gen.steps().add_commands(sub)
    inventory.add(sub)
    if not host:
        inspect.add(sub)
        check_command.add(sub)


def _terminate(signum: int, _frame: object) -> None:
    # SystemExit unwinds through every ``finally``: scratch dirs and containers are removed.
    raise SystemExit(128 + signum)


# Input fa-images refuses without a FatalError of its own: a path of the wrong kind (OSError),
# a value no parser accepts, JSON nested past the stack (RecursionError).
INPUT_ERRORS = (OSError, ValueError, RecursionError)
# Any other exception is a bug in fa-images: shown with its traceback, and this exit code.
INTERNAL_ERROR = 70
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.ENOMEM, errno.EIO}
REPORT_BUG = "this is a bug in fa-images, not in your input: please report it with the command line and the traceback"


def run_command(args: argparse.Namespace) -> int:
    """Runs a parsed command: the one boundary between fa-images and its user.

    A FatalError is one ``error:`` line and its exit code. An OSError, ValueError or
    RecursionError that no check turned into one is still a problem with the input (a path that
    is a directory, a file that cannot be read, a value no parser takes): one ``error:`` line,
    exit 2 (3 when the machine ran out of room). Anything else is a bug: its traceback, a
    request to report it, exit 70. Every line is escaped: messages quote untrusted text."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    try:
        return args.func(args)
    except FatalError as exc:
        _say(f"error: {_one_error(str(exc))}")
        return exc.exit_code
    except BrokenPipeError:  # our reader went away (`| head`): end quietly, as Unix tools do
        for stream in (sys.stdout, sys.stderr):
            silence(stream)
        return 128 + signal.SIGPIPE
    except RecursionError:
        _say("error: the input nests too deeply to be read")
        return UsageError.exit_code
    except OSError as exc:
        _say(f"error: {_one_error(_os_error(exc))}")
        return EnvironmentProblem.exit_code if exc.errno in _NO_SPACE else UsageError.exit_code
    except ValueError as exc:
        _say(f"error: {_one_error(str(exc) or type(exc).__name__)}")
        return UsageError.exit_code
    except KeyboardInterrupt:
        _say("interrupted")
        return 130
    except Exception:
        _say(traceback.format_exc().rstrip())
        _say(f"internal error: {REPORT_BUG}")
        return INTERNAL_ERROR


def exit_code_of(exc: BaseException) -> int:
    """The exit code ``run_command`` ends with for ``exc``: for a record (``build --report``)
    written before the exception reaches it."""
    if isinstance(exc, FatalError):
        return exc.exit_code
    if isinstance(exc, SystemExit):  # SIGTERM (_terminate) and sys.exit
        return exc.code if isinstance(exc.code, int) else 1
    if isinstance(exc, KeyboardInterrupt):
        return 130
    if isinstance(exc, BrokenPipeError):
        return 128 + signal.SIGPIPE
    if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
        return EnvironmentProblem.exit_code
    if isinstance(exc, INPUT_ERRORS):
        return UsageError.exit_code
    return INTERNAL_ERROR


def _one_error(message: str) -> str:
    """The error line and the indented lines fa-images puts under it (a hint, a list, a tail); any
    other newline came from input (a path, a value) and is shown escaped, so it cannot fake a line."""
    return re.sub(r"\n(?!  )", r"\\n", message)


def _os_error(exc: OSError) -> str:
    """'cannot use PATH: Is a directory', from an OSError that names its file."""
    if exc.filename is not None and exc.strerror:
        return f"cannot use {exc.filename}: {exc.strerror}"
    return str(exc) or type(exc).__name__


def silence(stream: object) -> None:
    """Points a closed pipe's descriptor at /dev/null, so later writes and the exit flush are quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())  # type: ignore[attr-defined]
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def _say(line: str) -> None:
    try:
        print(shown(line, keep_newlines=True), file=sys.stderr, flush=True)
    except BrokenPipeError:
        silence(sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fa_images.builder", description=__doc__)
    add_commands(parser.add_subparsers(dest="command", required=True))
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_command(build_parser().parse_args(argv))

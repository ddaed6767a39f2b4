"""Errors of the host-side tool, built on the builder's one ``FatalError`` family.

Exit codes: 1 some entries failed, 2 bad input (matrix, flag, wheel, a path of the wrong
kind), 3 the machine cannot do it, 4 source fetch, 5 compile, 6 wheel verification, 7 no
container engine, 8 a GPU that cannot run the image's GPU code (``check``: contract.EXIT_WRONG_ARCH),
70 an internal error (a bug: the traceback is printed, please report it), 130 interrupted.
``builder.cli.run_command`` is the one place they are turned into exit codes.

One exit code is not an error: 10 (``EXIT_TABLE_CHANGED``), ``compat refresh`` wrote a table
whose torch releases or flash-attn sdists differ from the one it read; 0 when they are the same.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .builder.errors import (  # noqa: F401  (re-exported: one family for the whole tool)
    BuildFailed,
    EnvironmentProblem,
    FatalError,
    SourceError,
    UsageError,
    VerificationFailed,
)
from .builder.untrusted import shown
from .builder.wording import counted

# `compat refresh`: the table it wrote differs from the one it read (its diff says how), so CI can
# act on it. Apart from every error's code above and from the builder's (contract.py).
EXIT_TABLE_CHANGED = 10


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input file, and where."""

    message: str
    file: str | None = None
    line: int | None = None
    entry: str | None = None
    hint: str | None = None

    def __str__(self) -> str:
        where = ":".join(str(p) for p in (self.file, self.line) if p is not None)
        text = f"{where}: " if where else ""
        text += f"entry {self.entry}: " if self.entry else ""
        text += self.message
        # One line, whatever the input held: a newline in a matrix value would fake another line.
        return shown(text + (f" ({self.hint})" if self.hint else ""))


def dedupe(problems: list[Problem]) -> list[Problem]:
    """One line per distinct problem: an axis value that is wrong in every combination it
    expands into is reported once, naming the first entry and how many more share it."""
    groups: dict[tuple, list[Problem]] = {}
    for p in problems:
        groups.setdefault((p.file, p.line, p.message, p.hint), []).append(p)
    out = []
    for group in groups.values():
        first = group[0]
        if len(group) > 1 and first.entry:
            first = replace(first, entry=f"{first.entry} (and {len(group) - 1} more)")
        out.append(first)
    return out


class ConfigError(UsageError):
    """Every problem found in a matrix or compat file, reported together."""

    SHOWN = 20  # a mistaken multi-megabyte file must not print thousands of lines

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        count = counted(len(problems), "problem")
        lines = [f"  {p}" for p in problems[: self.SHOWN]]
        if len(problems) > self.SHOWN:
            lines.append(f"  ... and {len(problems) - self.SHOWN} more")
        body = "\n".join(lines)
        super().__init__(f"{count} found:\n{body}" if len(problems) > 1 else str(problems[0]))


class EngineUnavailable(FatalError):
    """No container engine answers where the docker SDK looks."""

    exit_code = 7


class StepFailed(FatalError):
    """A step of an entry failed: a build, an export, a check, a push, or the engine under it.
    ``lines`` holds the end of its output. The entry fails; the run goes on (exit 1 at the end)."""

    def __init__(self, message: str, *, step: str | None = None, lines: list[str] | None = None) -> None:
        super().__init__(message)
        self.step = step  # the build instruction that failed, when the engine says which
        self.lines = lines or []


class EntriesFailed(FatalError):
    """A build ran, and some of its entries failed (the summary says which)."""

    exit_code = 1

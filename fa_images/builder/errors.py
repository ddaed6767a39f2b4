"""The one family of errors fa-images reports to users.

Every error a user can act on is a ``FatalError``: ``main()`` prints its message as one
line (no traceback) and exits with its ``exit_code``. This module is stdlib-only because
it travels into build contexts with the rest of ``fa_images.builder``.
"""

from __future__ import annotations


class FatalError(Exception):
    """An error with a message meant for a person and a distinct exit code."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class UsageError(FatalError):
    """Bad input: a CLI flag, a matrix, a wheel path."""

    exit_code = 2


class EnvironmentProblem(FatalError):
    """The machine cannot do what was asked: no CUDA torch, wrong nvcc, no engine."""

    exit_code = 3


class SourceError(FatalError):
    """The flash-attn source could not be fetched or failed its sha256 check."""

    exit_code = 4


class BuildFailed(FatalError):
    """The compiler or setup.py failed."""

    exit_code = 5


class VerificationFailed(FatalError):
    """A wheel was built but is not sound (wrong ABI, missing archs, fails to import)."""

    exit_code = 6

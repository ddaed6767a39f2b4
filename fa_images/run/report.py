"""The end of a run: a summary table a person reads and a JSON report a script reads."""

from __future__ import annotations

import json
from pathlib import Path

from ..builder import safe_io
from ..builder.cli import exit_code_of
from ..builder.errors import FatalError
from ..builder.untrusted import masked
from ..builder.wording import counted
from .executor import EntryResult
from .logger import Console, duration


def print_summary(console: Console, results: list[EntryResult]) -> None:
    rows = [("entry", "status", "image", "size", "wheel", "time", "check", "gpu check")]
    for r in results:
        total = sum(r.seconds.values())
        wheel = f"{Path(r.wheel).name} sha256:{r.wheel_sha256[:12]}" if r.wheel and r.wheel_sha256 else "-"
        image = r.image + (f" @{r.pushed[:19]}" if r.pushed else "")
        rows.append(
            (
                r.id,
                r.status + (f" ({r.failed_step})" if r.failed_step else "") + (" (up to date)" if r.up_to_date else ""),
                image,
                f"{r.image_size / 1e9:.2f} GB" if r.image_size else "-",
                wheel,
                duration(total) if total else "-",
                r.check,
                r.gpu_check,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    console.line()
    for row in rows:
        console.line("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    for r in results:
        if r.gpu_check_reason:  # a GPU check skipped for the wrong arch: why, and where it can run
            console.line(f"{r.id}: {r.gpu_check}: {r.gpu_check_reason}")
    failed = [r for r in results if r.status not in ("ok",)]
    for r in failed:
        if r.log and r.status == "failed":
            console.line(f"{r.id}: {r.error.splitlines()[0] if r.error else 'failed'}  (log: {r.log})")
    ok = len(results) - len(failed)
    console.line(f"{ok} of {counted(len(results), 'entry')} succeeded")


def write_report(
    path: Path,
    results: list[EntryResult],
    engine: str | None,
    *,
    failure: BaseException | None = None,
    not_run: list[str] | None = None,
) -> None:
    """The JSON a pipeline reads, on every way out of a build: ``failure`` is what ended it
    (its exit code and message; none on success), ``not_run`` the planned entries it never
    started (a base that could not be pulled stops the run before the first)."""
    ok = failure is None and all(r.status == "ok" for r in results)
    data: dict = {"engine": engine, "ok": ok, "entries": [r.to_dict() for r in results]}
    data["exit_code"] = 0 if failure is None else exit_code_of(failure)
    data["error"] = None if failure is None else message_of(failure)
    data["not_run"] = list(not_run or [])
    safe_io.write_file(path, json.dumps(data, indent=2) + "\n", what="--report")  # atomic, never through a link


def message_of(exc: BaseException) -> str:
    """What a report says of the exception that ended the command, every credential in it masked."""
    if isinstance(exc, FatalError):
        return masked(str(exc))
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    return masked(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)

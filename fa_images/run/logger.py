"""What a person sees during a long build: steps with ✓/✕ and durations, a live progress
line (entry, stage, step n/N, elapsed, last output), and a full log file per entry.

On a terminal the progress line rewrites itself; elsewhere (CI logs) it is printed when
the build step changes and as a heartbeat, so a 20-minute compile never looks hung.

Every line printed here is escaped (``untrusted.shown``): lines quote file names, paths, image
references and the engine's own output, and none of them may move the cursor, clear the
screen or ring the bell. Escaping here, where text meets the terminal, covers every caller;
the entry's log file keeps the engine's output as it came.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from ..builder import safe_io
from ..builder.cli import silence
from ..builder.untrusted import shown

HEARTBEAT_S = 60.0


def duration(seconds: float) -> str:
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes, sec = divmod(whole, 60)
    return f"{minutes}m{sec:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def say(text: str = "", *, out: TextIO | None = None) -> None:
    """A line of plain output outside the live console (``build --dry-run``), escaped as every line is."""
    print(shown(text, keep_newlines=True), file=out or sys.stdout)


class Console:
    def __init__(self, out: TextIO | None = None, *, color: bool | None = None) -> None:
        self.out = out or sys.stderr  # looked up now: a redirected stderr is the one written to
        self.tty = self.out.isatty()
        self.color = self.tty if color is None else color
        self._live = False
        self._last_beat = 0.0
        self._last_key: tuple = ()
        self._closed = False

    def _paint(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.color else text

    def _write(self, text: str) -> None:
        """Writes and flushes; a reader that went away (``| head``) ends the output, not the run."""
        if self._closed:
            return
        try:
            self.out.write(text)
            self.out.flush()
        except BrokenPipeError:
            self._closed = True
            silence(self.out)

    def _clear_live(self) -> None:
        if self._live:
            self._write("\r\033[K")
            self._live = False

    def _emit(self, escaped: str) -> None:
        self._clear_live()
        self._write(escaped + "\n")

    def line(self, text: str = "") -> None:
        """A line, escaped; a message of several lines keeps its newlines, as ``error:`` lines do."""
        self._emit(shown(text, keep_newlines=True))

    def progress(self, text: str, key: tuple) -> None:
        """A progress line; ``key`` changes when something new happens (a new build step)."""
        text = shown(text)  # one line: a newline or CR would break the line that rewrites itself
        if self.tty:
            width = shutil.get_terminal_size((120, 20)).columns - 1
            self._write("\r\033[K" + text[:width])
            self._live = True
            return
        now = time.monotonic()
        if key != self._last_key or now - self._last_beat >= HEARTBEAT_S:
            self._last_key, self._last_beat = key, now
            self._emit(text)

    @contextmanager
    def step(self, name: str) -> Iterator[dict]:
        """Runs a step; prints ✓ or ✕ with its duration. Set ``info["note"]`` to add a word."""
        started = time.monotonic()
        info: dict = {}
        try:
            yield info
        except BaseException:
            self._emit(f"  {self._paint('✕', '31')} {shown(name)} ({duration(time.monotonic() - started)})")
            raise
        mark = self._paint("-", "33") if info.get("skipped") else self._paint("✓", "32")
        note = f"  {shown(info['note'])}" if info.get("note") else ""
        # Only the marks' colours are written raw: they are the console's own.
        self._emit(f"  {mark} {shown(name)} ({duration(time.monotonic() - started)}){note}")


class EntryLog:
    """The full output of one entry, in a file the summary names."""

    def __init__(self, path: Path) -> None:
        self.path = path
        # Through safe_io: a symlink planted as logs/<id>.log is refused, never truncated.
        self._file = safe_io.OutputDir(path.parent, what="--log-dir").open_text(path.name)

    def write(self, line: str) -> None:
        self._file.write(line + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()

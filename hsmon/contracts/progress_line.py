"""The one progress line every long command draws on a terminal, with rich.

    line = ProgressLine("train", "steps")          # drawn only when stderr is a terminal
    line.update(13, 88, "loss 5.94 · acc 41% · 812 tok/s · eta 3m20s")
    line.note("paused: the disk is full")          # a line above it (plain stderr elsewhere)
    line.close()                                    # the last state stays on screen

`hsmon extract`, `regenerate`, `train`, `eval-drafter`, `online` and `run` show their progress this
way: the command's name, a bar, done / total and percent, then the command's own figures. Other
lines written to stderr while it is drawn (a pause, a warning) appear above it. Off a terminal
nothing is drawn: the events (a file, or stdout) and one line at the end say what happened.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, TextIO


def is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class ProgressLine:
    """One command's progress line (see the module's docstring); thread-safe."""

    def __init__(self, name: str, unit: str, stream: TextIO | None = None,
                 enabled: bool | None = None) -> None:
        self.name, self.unit = name, unit
        self.stream = stream or sys.stderr
        self.enabled = is_terminal(self.stream) if enabled is None else enabled
        self._lock = threading.Lock()
        self._progress: Any = None
        self._task: Any = None

    def _start(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn
        from rich.table import Column

        console = Console(file=self.stream, highlight=False, soft_wrap=False)
        # the figures take what is left of the line, cut at the terminal's edge, never wrapped
        rest = Column(no_wrap=True, overflow="ellipsis", ratio=1)
        self._progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(bar_width=20), TaskProgressColumn(),
            TextColumn("{task.fields[counts]}", table_column=Column(no_wrap=True)),
            TextColumn("{task.fields[detail]}", style="dim", markup=False, table_column=rest),
            console=console, auto_refresh=False, transient=False, redirect_stdout=False, expand=True,
            redirect_stderr=self.stream is sys.stderr,
        )
        self._task = self._progress.add_task(self.name, total=None, counts="", detail="")
        self._progress.start()

    def update(self, done: float, total: float | None, detail: str = "") -> None:
        """Redraw: ``done`` of ``total`` units (None: not known yet), then the command's figures."""
        if not self.enabled:
            return
        counts = f"{done:,.0f}/{total:,.0f} {self.unit}" if total else f"{done:,.0f} {self.unit}"
        with self._lock:
            if self._progress is None:
                self._start()
            self._progress.update(self._task, completed=done, total=total or None, counts=counts,
                                  detail=detail)
            self._progress.refresh()

    def note(self, text: str) -> None:
        """A line of its own, above the progress line (on stderr as it is, off a terminal)."""
        with self._lock:
            if self._progress is not None:
                self._progress.console.print(text, markup=False, highlight=False)
                return
        print(text, file=self.stream, flush=True)

    def close(self) -> None:
        """Stop redrawing; the last state stays on screen, and what follows starts on a line of its own."""
        with self._lock:
            if self._progress is not None:
                self._progress.refresh()
                self._progress.stop()
                self._progress = None

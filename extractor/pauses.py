"""Pauses of `hsmon extract`: one protocol for every reason (``disk``, ``shm``, ``server``).

`Pause` is one reason's state: it begins once (the progress's ``paused`` flag when no other reason
holds it, a ``pause`` event, a line for the human) and ends once (the flag cleared if it is its
own, a ``resume`` event with the seconds paused, a line). The lines go to stderr, terminal or not:
why it paused, what it waits for and how often it checks; then how long it waited. The events
carry the same facts for machines.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO

from hsmon.contracts import events as ev
from hsmon.contracts.units import format_duration

PREFIX = "hsmon extract: "


def _write(line: str, stream: TextIO | None) -> str:
    stream = sys.stderr if stream is None else stream
    # on a terminal the progress line (no newline, redrawn with \r) may be on screen: start afresh
    lead = "\n" if getattr(stream, "isatty", lambda: False)() else ""
    stream.write(f"{lead}{PREFIX}{line}\n")
    stream.flush()
    return line


def pause_line(
    reason: str, why: str, waits_for: str, every_s: float | str, stream: TextIO | None = None
) -> str:
    """Print ``paused (REASON): WHY; waiting for WAITS_FOR, checking every Ns``; returns the line.

    ``every_s``: the polling interval in seconds, or a phrase for one that varies
    ("with backoff, at most every 5s" prints ``checking with backoff, at most every 5s``).
    """
    every = f"every {every_s:g}s" if isinstance(every_s, (int, float)) else every_s
    return _write(f"paused ({reason}): {why}; waiting for {waits_for}, checking {every}", stream)


def resume_line(reason: str, paused_s: float, detail: str = "", stream: TextIO | None = None) -> str:
    """Print ``resumed (REASON) after 1m05s: DETAIL``; returns the line."""
    tail = f": {detail}" if detail else ""
    return _write(f"resumed ({reason}) after {format_duration(paused_s)}{tail}", stream)


class Pause:
    """One reason's pause (``disk``, ``shm`` or ``server``), begun and ended once each, from any thread."""

    def __init__(self, reason: str, events: Any, progress: Any) -> None:
        self.reason, self.events, self.progress = reason, events, progress
        self._since: float | None = None
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        return self._since is not None

    def begin(self, why: str, waits_for: str, every_s: float | str, **fields: Any) -> bool:
        """Pause (if not paused already for this reason): flag, ``pause`` event with ``fields``, line.
        Returns whether this call began it."""
        with self._lock:
            if self._since is not None:
                return False
            self._since = time.monotonic()
        with self.progress.lock:
            if self.progress.paused is None:  # another reason's pause keeps the flag
                self.progress.paused = self.reason
        self.events.emit(ev.PAUSE, reason=self.reason, **fields)
        pause_line(self.reason, why, waits_for, every_s)
        return True

    def end(self, detail: str, **fields: Any) -> float | None:
        """Resume (if paused for this reason): flag, ``resume`` event with the seconds paused and
        ``fields``, line. Returns the seconds paused, or None when it was not paused."""
        with self._lock:
            since, self._since = self._since, None
        if since is None:
            return None
        with self.progress.lock:
            if self.progress.paused == self.reason:
                self.progress.paused = None
        paused_s = time.monotonic() - since
        self.events.emit(ev.RESUME, reason=self.reason, paused_seconds=round(paused_s, 3), **fields)
        resume_line(self.reason, paused_s, detail)
        return paused_s

"""Pauses: one protocol for every reason a writer or reader waits (the extractor's ``disk``,
``shm``, ``server`` and ``spool``; the following trainer's ``rows``).

`Pause` is one reason's state: it begins once (the progress's ``paused`` flag when no other reason
holds it, a ``pause`` event, a line for the human) and ends once (the flag cleared if it is its
own, a ``resume`` event with the seconds paused, a line). The lines go to stderr, terminal or not,
after the program's prefix (``hsmon extract: ``, ``hsmon train: ``): why it paused, what it waits
for and how often it checks; then how long it waited. The events carry the same facts for
machines. A Pause given no event writer (a trainer rank that does not speak) keeps its state only.

No heavy imports here.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO

from hsmon.contracts import events as ev
from hsmon.contracts.units import format_duration

PREFIX = "hsmon extract: "  # the program's: `hsmon regenerate` sets its own once (extractor.errors)


def _write(line: str, stream: TextIO | None, prefix: str | None = None) -> str:
    stream = sys.stderr if stream is None else stream
    prefix = PREFIX if prefix is None else prefix
    # on a terminal the progress line (hsmon/contracts/progress_line.py) puts this line above itself
    stream.write(f"{prefix}{line}\n")
    stream.flush()
    return line


def pause_line(
    reason: str, why: str, waits_for: str, every_s: float | str, stream: TextIO | None = None,
    prefix: str | None = None,
) -> str:
    """Print ``paused (REASON): WHY; waiting for WAITS_FOR, checking every Ns``; returns the line.

    ``every_s``: the polling interval in seconds, or a phrase for one that varies
    ("with backoff, at most every 5s" prints ``checking with backoff, at most every 5s``).
    """
    every = f"every {every_s:g}s" if isinstance(every_s, (int, float)) else every_s
    return _write(f"paused ({reason}): {why}; waiting for {waits_for}, checking {every}", stream, prefix)


def resume_line(reason: str, paused_s: float, detail: str = "", stream: TextIO | None = None,
                prefix: str | None = None) -> str:
    """Print ``resumed (REASON) after 1m05s: DETAIL``; returns the line."""
    tail = f": {detail}" if detail else ""
    return _write(f"resumed ({reason}) after {format_duration(paused_s)}{tail}", stream, prefix)


class Pause:
    """One reason's pause, begun and ended once each, from any thread. ``progress``: an object with
    ``lock`` and ``paused`` (the extractor's progress line), or None."""

    def __init__(self, reason: str, events: Any | None, progress: Any | None = None,
                 prefix: str | None = None) -> None:
        self.reason, self.events, self.progress, self.prefix = reason, events, progress, prefix
        self._since: float | None = None
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        return self._since is not None

    @property
    def since(self) -> float | None:
        """When (time.monotonic) the pause began; None when not paused."""
        return self._since

    def begin(self, why: str, waits_for: str, every_s: float | str, **fields: Any) -> bool:
        """Pause (if not paused already for this reason): flag, ``pause`` event with ``fields``, line.
        Returns whether this call began it."""
        with self._lock:
            if self._since is not None:
                return False
            self._since = time.monotonic()
        if self.progress is not None:
            with self.progress.lock:
                if self.progress.paused is None:  # another reason's pause keeps the flag
                    self.progress.paused = self.reason
        if self.events is not None:
            self.events.emit(ev.PAUSE, reason=self.reason, **fields)
            pause_line(self.reason, why, waits_for, every_s, prefix=self.prefix)
        return True

    def end(self, detail: str, **fields: Any) -> float | None:
        """Resume (if paused for this reason): flag, ``resume`` event with the seconds paused and
        ``fields``, line. Returns the seconds paused, or None when it was not paused."""
        with self._lock:
            since, self._since = self._since, None
        if since is None:
            return None
        if self.progress is not None:
            with self.progress.lock:
                if self.progress.paused == self.reason:
                    self.progress.paused = None
        paused_s = time.monotonic() - since
        if self.events is not None:
            self.events.emit(ev.RESUME, reason=self.reason, paused_seconds=round(paused_s, 3), **fields)
            resume_line(self.reason, paused_s, detail, prefix=self.prefix)
        return paused_s

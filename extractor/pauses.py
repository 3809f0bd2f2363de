"""The human's line for a pause and a resume of `hsmon extract`, on stderr, terminal or not.

One line each, whatever the reason (``disk`` today, ``shm`` and ``server`` from other backends):
why it paused, what it waits for and how often it checks; then how long it waited. The events
(``pause``/``resume``) carry the same facts for machines; these lines are for a person reading a
terminal or a log file.
"""

from __future__ import annotations

import sys
from typing import TextIO

from hsmon.units import format_duration

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

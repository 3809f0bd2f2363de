"""How a process ended, as its log's last lines tell it (pure, except ``read_tail``).

Shared by `hsmon run` (the ``message`` of its ``error`` event) and the daemon (a watched process
that disappeared: a failure line makes it ``dead``). No heavy imports: the monitor imports this.
"""

from __future__ import annotations

import os
import re

# Lines that say a process failed, whoever printed them (the kernel's OOM killer via a shell,
# the C runtime, CUDA, PyTorch's allocator, a shell reporting a signal).
FAILURE_RE = re.compile(
    r"^(Killed|Segmentation fault|Bus error|Aborted)\b"
    r"|Fatal Python error"
    r"|CUDA error"
    r"|[Oo]ut of memory"
    r"|OutOfMemoryError"
)
TRACEBACK_HEAD = "Traceback (most recent call last):"
TAIL_BYTES = 64 * 1024
# Only the end of a log says how the process ended: a traceback logged and survived earlier, or a
# CUDA warning an hour before a clean exit, is not a failure. The last this many non-empty lines.
ENDING_LINES = 8


def traceback_final_line(lines: list[str]) -> tuple[int, str] | None:
    """(index, line) of the exception line of the last Python traceback in ``lines``."""
    start = None
    for i, line in enumerate(lines):
        if line.strip() == TRACEBACK_HEAD:
            start = i
    if start is None:
        return None
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if line.strip() and not line[:1].isspace():
            return i, line.strip()
    return None


def failure_line(lines: list[str], window: int = ENDING_LINES) -> str | None:
    """The line that says the process failed, when the log ends with one: the final line of a Python
    traceback, else a line matching ``FAILURE_RE`` (Killed, Segmentation fault, CUDA error, out of
    memory...), within the last ``window`` non-empty lines. None when the ending shows no failure."""
    ending = [i for i, line in enumerate(lines) if line.strip()][-window:]
    if not ending:
        return None
    final = traceback_final_line(lines)
    if final is not None and final[0] >= ending[0]:
        return final[1]
    for i in reversed(ending):
        if FAILURE_RE.search(lines[i]):
            return lines[i].strip()
    return None


def last_line(lines: list[str]) -> str | None:
    """The last non-empty line (what the process said last)."""
    return next((line.strip() for line in reversed(lines) if line.strip()), None)


def split_lines(data: bytes) -> list[str]:
    """Decoded lines of a log excerpt; carriage-return progress bars keep their last state."""
    text = data.decode("utf-8", errors="replace")
    return [line.rsplit("\r", 1)[-1] if "\r" in line.rstrip("\r") else line.rstrip("\r")
            for line in text.split("\n")]


def read_tail(path: str, max_bytes: int = TAIL_BYTES) -> list[str] | None:
    """The last lines of a file (at most ``max_bytes``; a cut first line dropped); None if unreadable."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(max(0, size - max_bytes))
            data = fh.read(max_bytes)
    except OSError:
        return None
    lines = split_lines(data)
    if size > max_bytes and lines:
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines.pop()
    return lines

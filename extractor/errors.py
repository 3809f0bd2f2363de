"""What every part of the extractor reports through: `UsageError` (bad input or options: one
line, exit status 2) and `log` (a line for the human on stderr, after the command's name)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

PROGRAM = "hsmon extract"  # the command this process runs: its lines start with it


@contextmanager
def program(name: str) -> Iterator[None]:
    """Name the command that runs (`hsmon regenerate`) in its lines and its pause lines while it
    runs; the names before it come back after, so a caller in the same process is not renamed."""
    global PROGRAM
    from hsmon.contracts import pauses

    before = PROGRAM, pauses.PREFIX
    PROGRAM, pauses.PREFIX = name, f"{name}: "
    try:
        yield
    finally:
        PROGRAM, pauses.PREFIX = before


class UsageError(Exception):
    """Bad input or options: printed as one line, exit status 2."""


def log(message: str) -> None:
    """A line for the human, on stderr (stdout may carry the event stream)."""
    print(f"{PROGRAM}: {message}", file=sys.stderr, flush=True)

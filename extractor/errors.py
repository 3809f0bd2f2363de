"""What every part of the extractor reports through: `UsageError` (bad input or options: one
line, exit status 2) and `log` (a line for the human on stderr, after the command's name)."""

from __future__ import annotations

import sys

PROGRAM = "hsmon extract"  # the command this process runs: its lines start with it


def set_program(name: str) -> None:
    """Name the command this process runs (`hsmon regenerate`), in its lines and its pause lines."""
    global PROGRAM
    from hsmon.contracts import pauses

    PROGRAM = name
    pauses.PREFIX = f"{name}: "


class UsageError(Exception):
    """Bad input or options: printed as one line, exit status 2."""


def log(message: str) -> None:
    """A line for the human, on stderr (stdout may carry the event stream)."""
    print(f"{PROGRAM}: {message}", file=sys.stderr, flush=True)

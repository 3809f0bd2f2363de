"""What every part of the extractor reports through: `UsageError` (bad input or options: one
line, exit status 2) and `log` (a line for the human on stderr). Imports nothing of the project."""

from __future__ import annotations

import sys


class UsageError(Exception):
    """Bad input or options: printed as one line, exit status 2."""


def log(message: str) -> None:
    """A line for the human, on stderr (stdout may carry the event stream)."""
    print(f"hsmon extract: {message}", file=sys.stderr, flush=True)

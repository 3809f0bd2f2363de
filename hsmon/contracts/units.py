"""Parsing and printing of sizes and durations for humans."""

from __future__ import annotations

import argparse
import re

_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgtp]?)(i?b?)\s*$", re.IGNORECASE)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}


def parse_size(text: str) -> int:
    """'10G', '512MiB', '1.5t', '4096' -> bytes. Decimal units (G = 1e9); 'GiB' is binary."""
    match = _SIZE_RE.match(str(text))
    if not match:
        raise ValueError(f"not a size: {text!r} (use a number with an optional unit: 500M, 10G, 2GiB)")
    number, unit, suffix = match.groups()
    base = 1024 if suffix.lower().startswith("i") else 1000
    return int(float(number) * base ** _POWERS[unit.lower()])


def format_bytes(n: float | None) -> str:
    """Bytes in decimal units: 1.2 GB."""
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


DAY_S = 86_400
YEAR_S = 365 * DAY_S


def format_days(seconds: int) -> str | None:
    """Two days and more as '11d13h', a year and more as 'over a year' (a projection at a
    trickle's rate: '294926h46m' said nothing a reader could use); None below two days."""
    if seconds >= YEAR_S:
        return "over a year"
    if seconds >= 2 * DAY_S:
        days, rest = divmod(seconds, DAY_S)
        return f"{days}d{rest // 3600:02d}h"
    return None


def format_duration(seconds: float | None) -> str:
    """Seconds as '3h12m', '4m05s', '12s'; two days and more as '11d13h'."""
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "-"
    seconds = max(0, int(seconds))
    if (long := format_days(seconds)) is not None:
        return long
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def port_number(text: str) -> int:
    """argparse type of a TCP port: 0-65535, or argparse's one-line error."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port: give a number from 0 to 65535")
    return port


def size_argument(text: str) -> int:
    """argparse type of a size (``parse_size``), refused in its own words."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None

"""Numbers and paths as the dashboard prints them: never more than 4 significant digits.

A person reads ``5.444`` and ``26.5%``; ``5.443658351898193`` is noise. Counters keep their
thousands separators (``34,662``) up to 10,000, then shrink (``34.7k``, ``1.23M``).
"""

from __future__ import annotations

import math
import re
import time

from hsmon.contracts.units import format_days

ELLIPSIS = "…"


def _decimals(value: float, sig: int) -> int:
    """Decimals that give ``value`` ``sig`` significant digits (none for large values)."""
    return max(0, sig - 1 - math.floor(math.log10(abs(value))))


def fmt_num(value: float | None, sig: int = 4, trim: bool = False) -> str:
    """A measurement with at most ``sig`` significant digits: 5.444, 0.2649, 1,235, 12.3k; '-' unknown.
    ``trim`` drops trailing zeros (0.002 rather than 0.002000) where no column is aligned."""
    text = _fmt_num(value, sig)
    if trim and "." in text and "e" not in text:
        text = text.rstrip("0").rstrip(".")
    return text


def _fmt_num(value: float | None, sig: int) -> str:
    if value is None or isinstance(value, bool):
        return "-"
    value = float(value)
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    if abs(value) >= 1e4:
        return fmt_count(value)
    if abs(value) < 1e-3:
        return f"{value:.{max(0, sig - 2)}e}"
    text = f"{value:,.{_decimals(value, sig)}f}"
    # 9.9996 rounds up to 10.000: one digit too many
    return f"{value:,.{max(0, _decimals(float(text.replace(',', '')), sig))}f}"


def fmt_count(n: float | None) -> str:
    """12,345 or 1.23M style for counters; '-' when unknown."""
    if n is None:
        return "-"
    n = float(n)
    for scale, unit in ((1e9, "G"), (1e6, "M")):
        if abs(n) >= scale:
            v = n / scale
            return (
                f"{v:.2f}{unit}" if abs(v) < 100 else f"{v:.1f}{unit}" if abs(v) < 1000 else f"{v:,.0f}{unit}"
            )
    if abs(n) >= 1e4:
        return f"{n / 1e3:.1f}k"
    return f"{n:,.0f}"


def fmt_rate(n: float | None, unit: str = "/s") -> str:
    if n is None:
        return "-"
    if abs(n) >= 100:
        return f"{fmt_count(n)}{unit}"
    return f"{n:.2f}{unit}" if abs(n) < 10 else f"{n:.1f}{unit}"


def fmt_pct(n: float | None) -> str:
    """A percentage already in 0–100 (CPU): '97%'."""
    return "-" if n is None else f"{n:.0f}%"


def fmt_pct_of(ratio: float | None) -> str:
    """A ratio 0–1 as a percentage with 3 significant digits: 0.26489 → '26.5%', 0.0412 → '4.12%'."""
    if not isinstance(ratio, (int, float)) or isinstance(ratio, bool):
        return "-"
    pct = float(ratio) * 100
    if pct == 0 or not math.isfinite(pct):
        return f"{pct:.0f}%"
    return f"{pct:.{min(2, _decimals(pct, 3))}f}%"


def shorten_path(path: str, width: int) -> str:
    """``path`` in at most ``width`` characters, cut in the middle at directory boundaries, so its
    start and its last directory stay readable: /tmp/nc/…/demo-out/extract."""
    if len(path) <= width:
        return path
    if width < 2:
        return ELLIPSIS[: max(width, 0)]
    parts = path.split("/")
    last, middle = parts[-1], parts[:-1]
    if not middle or len(last) + 2 > width:
        return ELLIPSIS + path[-(width - 1) :]

    def build(h: int, t: int) -> str:
        head = "/".join(middle[:h]) + "/" if h else ""
        return f"{head}{ELLIPSIS}/{'/'.join([*middle[len(middle) - t :], last])}"

    h = t = 0
    first = 2 if middle[0] == "" and len(middle) > 1 else 1  # "/tmp/" rather than "/"
    if first < len(middle) and len(build(first, 0)) <= width:
        h = first
    while h + t + 1 < len(middle) and len(build(h, t + 1)) <= width:
        t += 1
    while h + t + 1 < len(middle) and len(build(h + 1, t)) <= width:
        h += 1
    return build(h, t)


def fmt_clock(seconds: float | None) -> str:
    """A duration at a resolution that fits its size: '42s' below a minute, then '4m', then
    '2h05m' — so a figure that grows with the clock changes once a minute, not every second,
    once it is past a minute (the dashboard then repaints nothing while nothing else moves)."""
    if seconds is None or seconds != seconds or seconds in (float("inf"), float("-inf")):
        return "-"
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if (long := format_days(seconds)) is not None:
        return long
    hours, minutes = divmod(seconds // 60, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m"


_SECONDS_IN_TEXT = re.compile(r"\b(\d+) ?s\b")


def coarse_clocks(text: str) -> str:
    """``text`` (a state's reason from the daemon: 'progress events 68s ago') with its durations of
    a minute or more as ``fmt_clock`` writes them ('progress events 1m ago')."""
    if "s" not in text:
        return text
    return _SECONDS_IN_TEXT.sub(
        lambda m: fmt_clock(int(m.group(1))) if int(m.group(1)) >= 60 else m.group(0), text)


def has_short_clock(text: str) -> bool:
    """Whether ``text`` holds a duration below a minute (it then changes every second)."""
    return any(int(m.group(1)) < 60 for m in _SECONDS_IN_TEXT.finditer(text))


def clock_time(ts: float | None, span_s: float = 0.0) -> str:
    """A moment as the local wall clock: '14:02:31' (a span under 10 minutes, or no span), '14:02'
    (up to a day), 'Tue 14:02' beyond; '-' unknown."""
    if ts is None or ts != ts or ts in (float("inf"), float("-inf")):
        return "-"
    moment = time.localtime(ts)
    if span_s >= 86400:
        return time.strftime("%a %H:%M", moment)
    return time.strftime("%H:%M" if span_s >= 600 else "%H:%M:%S", moment)


def counted(n: float | None, singular: str, plural: str | None = None) -> str:
    """'1 chunk', '3 chunks', '34.7k rows' (``fmt_count``'s number, the word agreeing with it)."""
    word = singular if n == 1 else (plural or singular + "s")
    return f"{fmt_count(n)} {word}"

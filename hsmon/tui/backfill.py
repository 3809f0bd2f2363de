"""A job's rate history rebuilt from its events file, for a dashboard started on an existing job.

The status document carries only the current rates; the sparklines of a job that ran (or finished)
before the dashboard started would be flat. Its progress events carry cumulative counters
(``rows_done``, ``tokens_done``, ``bytes_done``) with timestamps, so a few of them spread over the
file give the whole run's rates. Cost is bounded whatever the file's size: one small window read
at each of ``points + 1`` evenly spaced offsets (about 1 MB at most).
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass, field

WINDOW_BYTES = 16384
COUNTERS = ("rows_done", "tokens_done", "bytes_done")


@dataclass(frozen=True)
class Reading:
    """Cumulative counters at a time (None where the event did not carry one)."""

    ts: float
    rows: float | None
    tokens: float | None
    bytes: float | None


@dataclass
class RateSeries:
    """Rates between consecutive readings, oldest first: (the later reading's time, the rate)."""

    rows_per_s: list[tuple[float, float]] = field(default_factory=list)
    tokens_per_s: list[tuple[float, float]] = field(default_factory=list)
    bytes_per_s: list[tuple[float, float]] = field(default_factory=list)


def _reading(line: bytes) -> Reading | None:
    if b'"rows_done"' not in line:
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if not isinstance(event, dict) or not isinstance(event.get("ts"), (int, float)):
        return None
    values = [event.get(key) if isinstance(event.get(key), (int, float)) else None for key in COUNTERS]
    if values[0] is None:
        return None
    return Reading(float(event["ts"]), *values)


def _first_reading(chunk: bytes, skip_partial: bool, last: bool = False) -> Reading | None:
    lines = chunk.split(b"\n")
    if skip_partial:
        lines = lines[1:]
    lines = lines[:-1]  # the window may cut the last line
    for line in reversed(lines) if last else lines:
        reading = _reading(line)
        if reading is not None:
            return reading
    return None


def sample_readings(path: str, points: int, window: int = WINDOW_BYTES) -> list[Reading]:
    """About ``points + 1`` progress readings spread evenly over the file, in time order: every
    reading of a small file (thinned evenly), else the first reading at each of ``points + 1``
    evenly spaced offsets (the last: the file's last reading)."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size <= (points + 1) * window:
                readings = [r for r in map(_reading, fh.read().split(b"\n")) if r is not None]
                step = max(1.0, (len(readings) - 1) / max(1, points))
                picked = sorted({round(i * step) for i in range(points + 1)} | {len(readings) - 1})
                readings = [readings[i] for i in picked if 0 <= i < len(readings)]
            else:
                readings = []
                for i in range(points + 1):
                    offset = min(size * i // points, size - window)
                    fh.seek(offset)
                    last = i == points
                    reading = _first_reading(fh.read(window) + b"\n" * last, offset > 0, last=last)
                    if reading is not None:
                        readings.append(reading)
    except OSError:
        return []
    return sorted({r.ts: r for r in readings}.values(), key=lambda r: r.ts)


def rate_series(readings: list[Reading]) -> RateSeries:
    """Rows/s, tokens/s and bytes/s between consecutive readings that carry that counter."""
    series = RateSeries()
    for out, counter in ((series.rows_per_s, "rows"), (series.tokens_per_s, "tokens"),
                         (series.bytes_per_s, "bytes")):
        points = [(r.ts, getattr(r, counter)) for r in readings if getattr(r, counter) is not None]
        for (t0, v0), (t1, v1) in itertools.pairwise(points):
            if t1 > t0:
                out.append((t1, max(0.0, (v1 - v0) / (t1 - t0))))
    return series


def events_rate_history(path: str, points: int) -> RateSeries | None:
    """The rate history of the job writing ``path``; None when it holds fewer than two readings."""
    readings = sample_readings(path, points)
    return rate_series(readings) if len(readings) > 1 else None

"""A job's readings over its whole run, kept at a bounded size: older readings are averaged into
wider buckets, as Prometheus's recording rules and Grafana's step do, so that a chart spans the
whole run (hours of a job read once a second) at a fixed memory and a fixed cost per reading.

A ``Series`` holds buckets of equal width along x (a time, or a training step): each bucket the
mean of the readings that fell in it. When a reading falls past the last of ``capacity`` buckets,
the width doubles and neighbouring buckets merge (their sums and counts add), so the series always
spans its first reading to its last in at most ``capacity`` buckets. Adding is O(1) (a merge, once
per doubling, is O(capacity)). A bucket no reading fell in (the dashboard skips documents while
nothing changes) repeats the reading before it. No Textual here: tested without a terminal.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator

CAPACITY = 240  # buckets per series: a few times the widest sparkline, a few KB per job
# The first width: small, so that a short run (a second of readings rebuilt from its events) keeps
# its shape; it doubles as the run goes, to span/capacity (a power of two: exact halvings).
START_WIDTH = 1 / 64


class Series:
    """Readings along x (seconds or steps) in at most ``capacity`` buckets of equal width."""

    def __init__(self, capacity: int = CAPACITY, width: float = START_WIDTH) -> None:
        self.capacity = capacity
        self.start_width = width
        self.clear()

    def clear(self) -> None:
        self.width = self.start_width
        self.origin: float | None = None
        self.last_x: float | None = None
        self.added = 0  # readings taken (each bucket may hold several)
        self._sums: list[float] = []
        self._counts: list[int] = []

    def __len__(self) -> int:
        return len(self._sums)

    def __bool__(self) -> bool:
        return bool(self._sums)

    def __iter__(self) -> Iterator[float]:
        return iter(self.values())

    def add(self, x: float, value: float) -> None:
        """One reading at ``x``; a reading before the first one is dropped (``rebuilt`` takes older
        readings)."""
        if not math.isfinite(value):
            return
        if self.origin is None:
            self.origin = x
        index = math.floor((x - self.origin) / self.width)
        if index < 0:
            return
        while index >= self.capacity:
            self._halve()
            index = math.floor((x - self.origin) / self.width)
        missing = index + 1 - len(self._sums)
        if missing > 0:
            self._sums.extend([0.0] * missing)
            self._counts.extend([0] * missing)
        self._sums[index] += value
        self._counts[index] += 1
        self.added += 1
        self.last_x = x if self.last_x is None else max(self.last_x, x)

    def _halve(self) -> None:
        """Twice the width: each pair of buckets becomes one."""
        self.width *= 2
        sums, counts = self._sums, self._counts
        self._sums = [sum(sums[i:i + 2]) for i in range(0, len(sums), 2)]
        self._counts = [sum(counts[i:i + 2]) for i in range(0, len(counts), 2)]

    def values(self) -> list[float]:
        """Each bucket's mean, oldest first; an empty bucket repeats the one before it."""
        out: list[float] = []
        last = 0.0
        for total, count in zip(self._sums, self._counts, strict=True):
            if count:
                last = total / count
            out.append(last)
        return out

    @property
    def span(self) -> tuple[float, float] | None:
        """(first x, last x) of the readings; None before the first."""
        if self.origin is None or self.last_x is None:
            return None
        return self.origin, self.last_x

    def settled(self) -> bool:
        """Whether one more equal reading leaves the chart as it is: every bucket reads the same."""
        values = self.values()
        return not values or values.count(values[0]) == len(values)

    def readings(self) -> list[tuple[float, float]]:
        """(x at the bucket's start, mean) of every bucket that holds a reading."""
        assert self.origin is not None or not self._sums
        return [(self.origin + i * self.width, total / count)  # type: ignore[operator]
                for i, (total, count) in enumerate(zip(self._sums, self._counts, strict=True)) if count]

    def rebuilt(self, older: Iterable[tuple[float, float]]) -> None:
        """The series again with ``older`` readings (x, value) before its own (a history rebuilt
        from the job's events file when the dashboard first sees a job that ran before it)."""
        mine = self.readings()
        last_x = self.last_x
        self.clear()
        for x, value in sorted([*older, *mine]):
            self.add(x, value)
        if last_x is not None:
            self.last_x = max(self.last_x or last_x, last_x)


def fit(values: list[float], width: int) -> list[float]:
    """``values`` in at most ``width`` cells: the whole series, each cell the reading at the end of
    its share (as a dashboard samples a series at each step), so the last cell is the newest."""
    count = len(values)
    if count <= width or width <= 0:
        return list(values)
    return [values[count * (i + 1) // width - 1] for i in range(width)]


def axis_labels(span: tuple[float, float] | None, width: int, label: Callable[[float], str]) -> str:
    """A one-line axis ``width`` cells wide under a chart of ``span``: the first x at the left, the
    last at the right and, when there is room, the middle one, each written by ``label``."""
    if span is None or width < 8:
        return ""
    first, last = span
    left, right = label(first), label(last)
    if len(left) + len(right) + 2 > width:
        return right.rjust(width)[:width]
    middle = label((first + last) / 2)
    gap = width - len(left) - len(right)
    if last > first and gap >= len(middle) + 6:
        before = (gap - len(middle)) // 2
        return f"{left}{'─' * (before - 1)} {middle} {'─' * (gap - len(middle) - before - 1)}{right}"
    return f"{left} {'─' * (gap - 2)} {right}"

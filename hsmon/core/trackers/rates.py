"""Rates of counters over a sliding time window (pure, no clock of its own)."""

from __future__ import annotations

from collections import deque


class RateWindow:
    """Samples of a monotone counter; ``rate()`` is its increase per second over ``window`` seconds."""

    def __init__(self, window: float = 30.0) -> None:
        self.window = window
        self._samples: deque[tuple[float, float]] = deque()

    def add(self, ts: float, value: float) -> None:
        if self._samples and value < self._samples[-1][1]:
            self._samples.clear()  # counter reset (restart, truncation): start over
        self._samples.append((ts, value))
        while len(self._samples) > 2 and ts - self._samples[1][0] >= self.window:
            self._samples.popleft()

    def rate(self) -> float | None:
        """Per-second increase between the oldest and newest sample; None before two samples."""
        if len(self._samples) < 2:
            return None
        (t0, v0), (t1, v1) = self._samples[0], self._samples[-1]
        if t1 <= t0:
            return None
        return (v1 - v0) / (t1 - t0)

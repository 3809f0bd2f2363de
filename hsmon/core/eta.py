"""An ETA a person can plan with (pure: no clock, no I/O).

The work is counted in the unit that measures it best: tokens where the job's token plan is known
(rows of varying lengths then weigh what they cost), else rows. The rate weighs recent work more
(an exponential decay over *active* time, half-life ``half_life_s``), so a job that speeds up or
slows down is followed within minutes, not hours. A gap with no progress far longer than the job's
usual interval is a pause: it counts for nothing (the ETA neither runs to infinity while paused nor
falls to zero after). The rate's spread over recent buckets gives a range (low–high) that is wide
where the rate is noisy and closes where it is steady.

Cost is flat: samples are folded into at most ``keep`` buckets of ``bucket_s`` seconds of work.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Eta:
    """Seconds left: the best estimate and its range (``low_s`` ≤ ``eta_s`` ≤ ``high_s``)."""

    eta_s: float
    low_s: float
    high_s: float


class EtaModel:
    """Samples of one monotone work counter (rows or tokens) -> the rate and ETA of its remainder."""

    def __init__(self, bucket_s: float = 10.0, keep: int = 60, half_life_s: float = 180.0,
                 pause_after_s: float = 60.0, spread: float = 2.0) -> None:
        self.bucket_s, self.half_life_s, self.spread = bucket_s, half_life_s, spread
        self.pause_after_s = pause_after_s
        self._buckets: deque[tuple[float, float]] = deque(maxlen=keep)  # (active seconds, work)
        self._reset()

    def _reset(self) -> None:
        self._buckets.clear()
        self._open = (0.0, 0.0)
        self._last: tuple[float, float] | None = None
        self._active_s = 0.0
        self._intervals = 0

    def add(self, ts: float, work: float) -> None:
        """One sample of the counter; a counter that goes back (a restart) starts the model over."""
        if self._last is not None and work < self._last[1]:
            self._reset()
        if self._last is None:
            self._last = (ts, work)
            return
        w0, dt = self._last[1], ts - self._last[0]
        if dt < 0:
            return
        self._last = (ts, work)
        if self._intervals >= 3 and dt > max(self.pause_after_s, 10 * self._active_s / self._intervals):
            return  # a pause: neither its time nor the one step that ends it counts
        self._active_s += dt
        self._intervals += 1
        odt, odw = self._open[0] + dt, self._open[1] + (work - w0)
        if odt >= self.bucket_s:
            self._buckets.append((odt, odw))
            odt, odw = 0.0, 0.0
        self._open = (odt, odw)

    def rate(self) -> tuple[float, float] | None:
        """The recent rate (work per active second) and its relative uncertainty; None before any."""
        parts = list(self._buckets) + ([self._open] if self._open[0] > 0 else [])
        if not parts:
            return None
        weights, rates, age = [], [], 0.0
        for dt, dw in reversed(parts):  # newest first: age is the active time since
            weights.append(dt * 0.5 ** (age / self.half_life_s))
            rates.append(dw / dt)
            age += dt
        total = sum(weights)
        mean = sum(w * r for w, r in zip(weights, rates, strict=True)) / total
        if mean <= 0:
            return None
        var = sum(w * (r - mean) ** 2 for w, r in zip(weights, rates, strict=True)) / total
        n_eff = total * total / sum(w * w for w in weights)
        rel = self.spread * math.sqrt(var / n_eff) / mean if n_eff > 1 else 0.5
        return mean, min(rel, 0.8)

    def estimate(self, remaining: float) -> Eta | None:
        """Seconds until ``remaining`` more work is done at the recent rate; None without a rate."""
        got = self.rate()
        if got is None:
            return None
        rate, rel = got
        remaining = max(0.0, remaining)
        return Eta(remaining / rate, remaining / (rate * (1 + rel)), remaining / (rate * (1 - rel)))


def job_eta(rows: EtaModel, tokens: EtaModel, rows_done: int, rows_total: int | None,
            tokens_done: int, tokens_total: int | None) -> Eta | None:
    """The job's ETA: by tokens where its token plan is known and tokens move, else by rows."""
    if tokens_total and tokens_done > 0:
        got = tokens.estimate(tokens_total - tokens_done)
        if got is not None:
            return got
    if rows_total is not None:
        return rows.estimate(rows_total - rows_done)
    return None

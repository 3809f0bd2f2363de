"""A tracker's exception never ends a tick: it is counted by tracker, logged once per kind, and the
job's other trackers, and every other job, run on (the failing tracker's last figures stand).

A tracker that has failed ``BLIND_AFTER`` calls in a row (of one kind: due, poll or section) is
*blind*: ``blind(job)`` says since when and with what error; the job's verdict then says so
(hsmon/core/state_blind.py) instead of standing on its last figures. One success clears it.

A call that never returns (a read blocked on a hung mount) raises nothing: ``in_call(job)`` names
the call in progress and since when, so that a job whose figures have aged can say where the tick is
stuck (hsmon/core/state_blind.py ``stale_status``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

log = logging.getLogger("hsmon.trackers")
T = TypeVar("T")
BLIND_AFTER = 3  # failed calls in a row (about as many ticks) before a tracker reads blind


@dataclass
class Blind:
    """A tracker failing call after call: since when, how many times, the last error."""

    tracker: str
    since_ts: float
    failures: int
    error: str


@dataclass(frozen=True)
class CallInProgress:
    """A guarded tracker call that has not returned yet."""

    tracker: str
    phase: str  # due | poll | section | ""
    since_ts: float


class TrackerErrors:
    """Exceptions raised by trackers, counted by tracker (``hsmon_tracker_errors_total{tracker}``)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._logged: set[tuple[str, str]] = set()
        self._failing: dict[tuple[str, str, str], Blind] = {}  # (job, tracker, call) -> failing run
        self._lock = threading.Lock()
        self._in_call: dict[str, CallInProgress] = {}  # job -> the call running now

    def guard(self, tracker: str, call: Callable[[], T], fallback: T, job: str = "", phase: str = "") -> T:
        """``call()``, or ``fallback`` when it raises (counted, and logged the first time per kind).
        ``phase`` names the kind of call (due, poll, section): failures in a row are counted per kind,
        so that a section answered from old figures does not hide a poll that fails every tick."""
        outer = self._in_call.get(job)
        self._in_call[job] = CallInProgress(tracker, phase, time.time())
        try:
            result = call()
        except Exception as exc:
            self.record(tracker, exc, job, phase)
            return fallback
        finally:
            if outer is None:
                self._in_call.pop(job, None)
            else:
                self._in_call[job] = outer
        if self._failing:
            with self._lock:
                self._failing.pop((job, tracker, phase), None)
        return result

    def in_call(self, job: str) -> CallInProgress | None:
        """The job's tracker call running now (None between calls)."""
        return self._in_call.get(job)

    def blind(self, job: str) -> list[Blind]:
        """The job's trackers failing ``BLIND_AFTER`` calls or more in a row, each once (oldest run)."""
        with self._lock:
            runs = [b for (j, _, _), b in self._failing.items() if j == job and b.failures >= BLIND_AFTER]
        out: dict[str, Blind] = {}
        for run in sorted(runs, key=lambda b: b.since_ts):
            out.setdefault(run.tracker, run)
        return list(out.values())

    def record(self, tracker: str, exc: BaseException, job: str = "", phase: str = "") -> None:
        kind = type(exc).__name__
        with self._lock:
            self.counts[tracker] = self.counts.get(tracker, 0) + 1
            run = self._failing.setdefault((job, tracker, phase), Blind(tracker, time.time(), 0, ""))
            run.failures += 1
            run.error = f"{kind}: {exc}"[:300]
            first = (tracker, kind) not in self._logged
            self._logged.add((tracker, kind))
        if first:
            where = f" (job {job})" if job else ""
            log.error("tracker %s failed%s: %s: %s; the rest of the monitor runs on; further %s errors of "
                      "this tracker are only counted (hsmon_tracker_errors_total)", tracker, where, kind, exc,
                      kind, exc_info=exc)

    def snapshot(self) -> dict[str, int]:
        """Errors so far, by tracker."""
        with self._lock:
            return dict(self.counts)

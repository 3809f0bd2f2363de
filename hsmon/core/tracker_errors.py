"""A tracker's exception never ends a tick: it is counted by tracker, logged once per kind, and the
job's other trackers, and every other job, run on (the failing tracker's last figures stand)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger("hsmon.trackers")
T = TypeVar("T")


class TrackerErrors:
    """Exceptions raised by trackers, counted by tracker (``hsmon_tracker_errors_total{tracker}``)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self._logged: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def guard(self, tracker: str, call: Callable[[], T], fallback: T, job: str = "") -> T:
        """``call()``, or ``fallback`` when it raises (counted, and logged the first time per kind)."""
        try:
            return call()
        except Exception as exc:
            self.record(tracker, exc, job)
            return fallback

    def record(self, tracker: str, exc: BaseException, job: str = "") -> None:
        kind = type(exc).__name__
        with self._lock:
            self.counts[tracker] = self.counts.get(tracker, 0) + 1
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

"""What the dashboard remembers of a job across documents: recent figures for its sparklines, its
events, its training updates (the document carries only the current figures). No Textual here."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from hsmon.status_doc import ENDED_STATES, JobStatus, TrainingSection

FINISHED_STATES = ENDED_STATES
HISTORY_POINTS = 60
EVENT_HISTORY = 200  # a document carries the last 20 events; the log keeps more across documents


@dataclass
class JobHistory:
    """Recent figures of one job, for sparklines (the document carries only the current ones)."""

    rows_per_s: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    tokens_per_s: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    bytes_per_s: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    dump_files: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    training: deque[TrainingSection] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    events: list[dict[str, Any]] = field(default_factory=list)
    # per server URL: queued requests and generated tokens/s (hsmon/tui/engine_view.py draws them)
    server_queued: dict[str, deque[float]] = field(default_factory=dict)
    server_tokens_per_s: dict[str, deque[float]] = field(default_factory=dict)
    _event_keys: set[tuple[Any, ...]] = field(default_factory=set)
    last_generated_ts: float | None = None
    last_step: Any = None
    finished: bool = False

    def add(self, job: JobStatus, generated_ts: float | None, skipped: int = 0) -> bool:
        """Record one document's figures; False (nothing recorded) for a document already seen, and
        once the job has ended: its rates fall to zero then, and the history of the run is what a
        person wants to look at (until the job starts again). ``skipped``: documents read before
        this one that repeated the last recorded figures (not sent: hsmon/tui/clocks.py)."""
        if generated_ts is not None and generated_ts == self.last_generated_ts:
            return False
        self.last_generated_ts = generated_ts
        if self.finished and job.state not in FINISHED_STATES:
            self._new_run()  # started again after it ended (Resume, a new launch): never joined
        self._add_events(job.recent_events)
        self.finished = job.state in FINISHED_STATES
        if self.finished:
            self._add_training(job)  # the last step may arrive with the done
            return False
        for series in self._series():
            if series and skipped:
                series.extend([series[-1]] * min(skipped, HISTORY_POINTS))
        progress = job.progress
        self.rows_per_s.append(float(progress.rows_per_s or 0.0) if progress else 0.0)
        self.tokens_per_s.append(float(progress.tokens_per_s or 0.0) if progress else 0.0)
        self.bytes_per_s.append(float(progress.bytes_per_s or 0.0) if progress else 0.0)
        self.dump_files.append(float(job.dump.files or 0.0) if job.dump else 0.0)
        for srv in job.servers:
            for series, value in (
                (self.server_queued, srv.load.queued), (self.server_tokens_per_s, srv.load.gen_tokens_per_s)
            ):
                points = series.setdefault(srv.url, deque(maxlen=HISTORY_POINTS))
                points.append(float(value or 0.0))
        self._add_training(job)
        return True

    def _new_run(self) -> None:
        """Forget the figures of the run that ended (its events stay in the log)."""
        for series in self._series():
            series.clear()
        self.server_queued.clear()
        self.server_tokens_per_s.clear()
        self.training.clear()
        self.last_step = None

    def _series(self) -> list[deque[float]]:
        return [self.rows_per_s, self.tokens_per_s, self.bytes_per_s, self.dump_files,
                *self.server_queued.values(), *self.server_tokens_per_s.values()]

    def settled(self) -> bool:
        """Whether another document with the same figures leaves every sparkline as it is: the job
        ended (its history is frozen), or every series is full of one value."""
        return self.finished or all(len(series) == series.maxlen and series.count(series[0]) == len(series)
                                    for series in self._series())

    def backfill(self, rows_per_s: list[float], tokens_per_s: list[float], bytes_per_s: list[float]) -> None:
        """Put older readings (rebuilt from the events file) before the ones recorded so far."""
        for series, older in ((self.rows_per_s, rows_per_s), (self.tokens_per_s, tokens_per_s),
                              (self.bytes_per_s, bytes_per_s)):
            newer = list(series)
            series.clear()
            series.extend([*older, *newer])

    def _add_events(self, recent: list[dict[str, Any]]) -> None:
        """Merge a document's recent events into the kept ones (in time order, each once)."""
        for event in recent:
            key = (event.get("ts"), event.get("kind"), event.get("job"), event.get("state"))
            if key in self._event_keys:
                continue
            self._event_keys.add(key)
            ts = event.get("ts") if isinstance(event.get("ts"), (int, float)) else float("inf")
            at = len(self.events)
            while at and (self.events[at - 1].get("ts") or 0) > ts:
                at -= 1
            self.events.insert(at, event)
        if len(self.events) > EVENT_HISTORY:
            for old in self.events[:-EVENT_HISTORY]:
                self._event_keys.discard((old.get("ts"), old.get("kind"), old.get("job"), old.get("state")))
            del self.events[:-EVENT_HISTORY]

    def _add_training(self, job: JobStatus) -> None:
        training = job.training
        if training is not None and training.step != self.last_step:
            self.last_step = training.step
            self.training.append(training)

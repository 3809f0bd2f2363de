"""What the dashboard remembers of a job across documents: its figures over the whole run for its
charts (bounded: hsmon/tui/series.py), its events, its training's loss and accuracy per draft
position over its steps (the document carries only the current figures). No Textual here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hsmon.status_doc import ENDED_STATES, JobStatus, TrainingSection
from hsmon.tui.series import Series

FINISHED_STATES = ENDED_STATES
HISTORY_POINTS = 60  # readings the events file's backfill gives (hsmon/tui/backfill.py)
EVENT_HISTORY = 200  # a document carries the last 20 events; the log keeps more across documents


@dataclass
class UnrollHistory:
    """A training's loss and accuracy at each draft position, over its steps (x: the optimizer step)."""

    loss: list[Series] = field(default_factory=list)
    acc: list[Series] = field(default_factory=list)

    def add(self, training: TrainingSection) -> None:
        step = training.step
        if not isinstance(step, (int, float)) or isinstance(step, bool):
            return
        for name, series in (("loss", self.loss), ("acc", self.acc)):
            values = getattr(training, name)
            values = values if isinstance(values, list) else [values]
            for position, value in enumerate(values):
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    while len(series) <= position:
                        series.append(Series(width=1.0))  # along whole steps
                    series[position].add(float(step), float(value))

    def clear(self) -> None:
        self.loss.clear()
        self.acc.clear()


@dataclass
class JobHistory:
    """One job's figures over its run, for its charts (the document carries only the current ones);
    x is the document's time (``generated_ts``)."""

    rows_per_s: Series = field(default_factory=Series)
    tokens_per_s: Series = field(default_factory=Series)
    bytes_per_s: Series = field(default_factory=Series)
    dump_files: Series = field(default_factory=Series)
    unroll: UnrollHistory = field(default_factory=UnrollHistory)
    events: list[dict[str, Any]] = field(default_factory=list)
    # per server URL: queued requests and generated tokens/s (hsmon/tui/engine_view.py draws them)
    server_queued: dict[str, Series] = field(default_factory=dict)
    server_tokens_per_s: dict[str, Series] = field(default_factory=dict)
    _event_keys: set[tuple[Any, ...]] = field(default_factory=set)
    last_generated_ts: float | None = None
    last_step: Any = None
    finished: bool = False

    def add(self, job: JobStatus, generated_ts: float | None, skipped: int = 0) -> bool:
        """Record one document's figures; False (nothing recorded) for a document already seen, and
        once the job has ended: its rates fall to zero then, and the history of the run is what a
        person wants to look at (until the job starts again). ``skipped``: documents read before
        this one that repeated the last recorded figures (not sent: hsmon/tui/clocks.py): the time
        between is the last reading's in the charts."""
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
        if generated_ts is None:
            return False
        progress = job.progress
        self.rows_per_s.add(generated_ts, float(progress.rows_per_s or 0.0) if progress else 0.0)
        self.tokens_per_s.add(generated_ts, float(progress.tokens_per_s or 0.0) if progress else 0.0)
        self.bytes_per_s.add(generated_ts, float(progress.bytes_per_s or 0.0) if progress else 0.0)
        self.dump_files.add(generated_ts, float(job.dump.files or 0.0) if job.dump else 0.0)
        for srv in job.servers:
            for series, value in (
                (self.server_queued, srv.load.queued), (self.server_tokens_per_s, srv.load.gen_tokens_per_s)
            ):
                series.setdefault(srv.url, Series()).add(generated_ts, float(value or 0.0))
        self._add_training(job)
        return True

    def _new_run(self) -> None:
        """Forget the figures of the run that ended (its events stay in the log)."""
        for series in self._series():
            series.clear()
        self.server_queued.clear()
        self.server_tokens_per_s.clear()
        self.unroll.clear()
        self.last_step = None

    def _series(self) -> list[Series]:
        return [self.rows_per_s, self.tokens_per_s, self.bytes_per_s, self.dump_files,
                *self.server_queued.values(), *self.server_tokens_per_s.values()]

    def settled(self) -> bool:
        """Whether another document with the same figures leaves every chart as it is: the job
        ended (its history is frozen), or every series reads one value."""
        return self.finished or all(series.settled() for series in self._series())

    def backfill(self, rows_per_s: list[tuple[float, float]], tokens_per_s: list[tuple[float, float]],
                 bytes_per_s: list[tuple[float, float]]) -> None:
        """Put older readings (time, value), rebuilt from the events file, before the ones recorded."""
        for series, older in ((self.rows_per_s, rows_per_s), (self.tokens_per_s, tokens_per_s),
                              (self.bytes_per_s, bytes_per_s)):
            series.rebuilt(older)

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
            self.unroll.add(training)

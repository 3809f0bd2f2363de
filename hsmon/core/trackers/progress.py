"""Progress tracker: tails a job's events file (the events contract) and keeps the job's counters.

Copes with a file that does not exist yet, truncation, rotation, a partial last line and garbage
lines (hsmon.contracts.events.EventFileReader). Field names are read liberally (cumulative ``rows_done``
or per-event increments) so that other writers' events count too.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import msgspec

from hsmon.contracts import events as ev
from hsmon.contracts.rejects import classify, clean_counts
from hsmon.core.eta import EtaModel, job_eta
from hsmon.core.trackers.rates import RateWindow
from hsmon.status_doc import EventsSection, Progress, TrainingSection

PROGRESS_COUNTERS = ("rows_done", "tokens_done", "chunks_done", "step")


class ProgressTracker:
    def __init__(self, path: str, recent: int = 50, start: int = 0) -> None:
        self.path = path
        self.reader = ev.EventFileReader(path, offset=start)  # ``start``: the job's first byte
        self._lock = threading.Lock()
        self.recent: deque[dict[str, Any]] = deque(maxlen=recent)
        self.exists = False
        self.job_id: str | None = None
        self.pid: int | None = None
        self.server_urls: list[str] = []  # the start event's `urls` (hsmon extract --backend sglang)
        self.dump_dir: str | None = None  # the start event's `dump_dir` (the same)
        self.started = False
        self.started_as: str | None = None  # the job kind its start event shows (extract, train)
        self.arch: str | None = None  # a trainer's start event's drafter architecture
        self.start_ts: float | None = None
        self.wall_start_ts: float | None = None  # its process's start: the model load included
        self.rows_done = 0
        self.rows_total: int | None = None
        self.tokens_done = 0
        self.tokens_total: int | None = None
        self.chunks_done = 0
        self.chunks_total: int | None = None
        self.rejects = 0
        self.rejects_by_reason: dict[str, int] = {}  # hsmon.contracts.rejects classes
        self.bytes_done = 0
        self.terminal_kind: str | None = None
        self.terminal_ts: float | None = None
        self.terminal_event: dict[str, Any] | None = None  # the done/stopped event itself
        self.paused_reason: str | None = None
        self.last_error: str | None = None
        self.last_event_ts: float | None = None
        self.last_kind: str | None = None
        self.last_progress_ts: float | None = None
        self.training: dict[str, Any] | None = None
        self.kind_counts: dict[str, int] = {}
        # `hsmon run`: its own PID (alive while it records how the command ends), the command's
        # log, and the log's line count (its heartbeats carry it: a growing log is progress)
        self.runner_pid: int | None = None
        self.log_path: str | None = None
        self.log_lines = 0
        self._rows_rate = RateWindow(60.0)
        self._tokens_rate = RateWindow(60.0)
        self._bytes_rate = RateWindow(60.0)
        # a training's current phase: (ts, step) of its first step event since the (re)start or
        # the last resume; its ETA is the steps left at the step rate measured since then
        self._step_phase: tuple[float, float] | None = None
        self._rows_eta, self._tokens_eta = EtaModel(), EtaModel()  # hsmon/core/eta.py
        # the averages' span: the seconds of the runs before the current one (each from its start
        # to its last event) and the counts an earlier run not in this file had done
        self._earlier_runs_s = 0.0
        self._counted_before: tuple[int, int] | None = None

    def poll(self) -> int:
        """Read new events; returns how many arrived."""
        import os

        new = self.reader.poll()
        exists = os.path.exists(self.path)
        with self._lock:
            self.exists = exists
            for event in new:
                self._apply(event)
        return len(new)

    def _apply(self, e: dict[str, Any]) -> None:
        """Take one event into the counters (the kind decides which)."""
        kind = e["kind"]
        ts = ev.event_number(e, "ts") or time.time()
        self.kind_counts[kind] = self.kind_counts.get(kind, 0) + 1
        previous_ts = self.last_event_ts
        self.last_event_ts, self.last_kind = ts, kind
        if kind != ev.STATE:
            self.recent.append(e)
        if isinstance(e.get("job"), str):
            self.job_id = e["job"]
        before = self._progress_key()
        by_reason = clean_counts(e.get("rejects_by_reason"))
        if by_reason is not None:  # start, heartbeat, done ... carry the run's own count
            self.rejects_by_reason = by_reason
        elif kind == ev.START:
            self.rejects_by_reason = {}
        if kind in (ev.START, ev.RESUME):
            self._step_phase = None  # a new phase: its own step rate
        if kind == ev.START:
            if self.wall_start_ts is not None and previous_ts is not None:
                self._earlier_runs_s += max(0.0, previous_ts - self.wall_start_ts)
            self._on_start(e, ts)
            if self._counted_before is None:
                self._counted_before = (self.rows_done, self.tokens_done)
        elif kind in (ev.ROW, ev.ROWS, ev.HEARTBEAT, ev.CHUNK):
            self._on_counts(kind, e)
        elif kind == ev.REJECT:
            self.rejects += 1
            key = e.get("reason_class")
            key = key if isinstance(key, str) and len(key) <= 40 else classify(str(e.get("reason", "")))
            self.rejects_by_reason[key] = self.rejects_by_reason.get(key, 0) + 1
        elif kind == ev.PAUSE:
            self.paused_reason = str(e.get("reason", "unknown"))
        elif kind == ev.RESUME:
            self.paused_reason = None
        elif kind in ev.TERMINAL_KINDS:
            self.terminal_kind, self.terminal_ts, self.terminal_event = kind, ts, e
            self.paused_reason = None
        elif kind == ev.ERROR:
            self.last_error = str(e.get("message") or e.get("error") or "error")[:300]
        elif kind in (ev.STEP, ev.CHECKPOINT, ev.EVAL):
            self._on_training(kind, e, ts)
        if self._progress_key() != before:
            self.last_progress_ts = ts
            self._rows_rate.add(ts, self.rows_done)
            self._tokens_rate.add(ts, self.tokens_done)
            self._bytes_rate.add(ts, self.bytes_done)
            self._rows_eta.add(ts, self.rows_done)
            self._tokens_eta.add(ts, self.tokens_done)

    def _progress_key(self) -> tuple[Any, ...]:
        """What counts as progress: any of these moving."""
        return (self.rows_done, self.tokens_done, self.chunks_done, (self.training or {}).get("step"),
                self.log_lines)

    def _on_start(self, e: dict[str, Any], ts: float) -> None:
        self.started, self.start_ts = True, ts
        self.training = None  # a new run of a training: the last one's figures are not its own
        launched = ev.event_number(e, "process_started_ts")  # the load before the start event counts
        self.wall_start_ts = launched if launched is not None and launched <= ts else ts
        self.started_as = started_as(e)
        arch = e.get("arch")  # a trainer's drafter architecture (eagle3, eagle3.1)
        self.arch = arch if isinstance(arch, str) else None
        self.terminal_kind = self.terminal_ts = self.paused_reason = self.terminal_event = None
        pid = e.get("pid")
        self.pid = pid if isinstance(pid, int) else None
        runner = e.get("runner_pid")
        self.runner_pid = runner if isinstance(runner, int) else None
        self.log_path = e.get("log") if isinstance(e.get("log"), str) else None
        self.log_lines = 0
        dump = e.get("dump_dir")
        self.dump_dir = dump if isinstance(dump, str) and dump.startswith("/") else None
        urls = e.get("urls")
        if isinstance(urls, list):
            self.server_urls = [u for u in urls if isinstance(u, str) and u.startswith("http")][:16]
        for attr, keys in (
            ("rows_done", ("rows_done",)),
            ("tokens_done", ("tokens_done",)),
            ("rejects", ("rejects",)),
            ("rows_total", ("rows_total", "total_rows")),
            ("tokens_total", ("tokens_total", "total_tokens")),
            ("chunks_total", ("chunks_total", "total_chunks")),
        ):
            value = ev.event_number(e, *keys)
            if value is not None:
                setattr(self, attr, int(value))

    def _on_counts(self, kind: str, e: dict[str, Any]) -> None:
        """row, rows, heartbeat and chunk events: cumulative counts, or increments."""
        rows = ev.event_number(e, "rows_done")
        tokens = ev.event_number(e, "tokens_done")
        if kind == ev.ROW and rows is None:
            self.rows_done += 1
            self.tokens_done += int(ev.event_number(e, "tokens") or 0)
        elif kind == ev.ROWS and rows is None:
            self.rows_done += int(ev.event_number(e, "rows", "count") or 0)
            self.tokens_done += int(ev.event_number(e, "tokens") or 0)
        if rows is not None:
            self.rows_done = int(rows)
        if tokens is not None:
            self.tokens_done = int(tokens)
        chunks = ev.event_number(e, "chunks_done")
        if kind == ev.CHUNK:
            self.chunks_done = int(chunks) if chunks is not None else self.chunks_done + 1
            self.bytes_done += int(ev.event_number(e, "bytes") or 0)
        elif chunks is not None:
            self.chunks_done = int(chunks)
        for attr, key in (("log_lines", "log_lines"), ("rejects", "rejects"), ("rows_total", "rows_total"),
                          ("tokens_total", "tokens_total")):
            value = ev.event_number(e, key)
            if value is not None:
                setattr(self, attr, int(value))

    def _on_training(self, kind: str, e: dict[str, Any], ts: float) -> None:
        """step, checkpoint and eval events: the ``training`` section."""
        training = self.training or {
            "step": None,
            "epoch": None,
            "loss": None,
            "acc": None,
            "tokens_per_s": None,
            "last_checkpoint": None,
            "eta_s": None,
        }
        if kind == ev.STEP:
            self._on_step(e, ts, training)
        elif kind == ev.CHECKPOINT:
            training["last_checkpoint"] = e.get("path") or e.get("dir")
            self.last_progress_ts = ts
        else:
            training["eval"] = {k: v for k, v in e.items() if k not in ("v", "ts", "job", "kind")}
        self.training = training

    def _on_step(self, e: dict[str, Any], ts: float, training: dict[str, Any]) -> None:
        for key in ("step", "epoch", "total_steps", "lr", "grad_norm", "data_wait_frac"):
            if key in e:
                training[key] = e[key]
        # per-unroll-step lists (hsmon train: losses/accs; loss is then the weighted sum)
        training["loss"] = e.get("losses", e.get("loss", training.get("loss")))
        training["acc"] = e.get("accs", e.get("acc", training.get("acc")))
        if "loss" in e and "losses" in e:
            training["loss_weighted"] = e["loss"]
        rate = ev.event_number(e, "tokens_per_s", "tokens_s")
        if rate is not None:
            training["tokens_per_s"] = rate
        tokens = ev.event_number(e, "tokens_done", "tokens")  # cumulative, as hsmon train writes it
        if tokens is not None:
            self.tokens_done = int(tokens)
        step = ev.event_number(e, "step")
        if step is not None:
            training["eta_s"] = self._step_eta(ts, step, ev.event_number(e, "total_steps"), e.get("eta_s"))

    def _step_eta(self, ts: float, step: float, total: float | None, sent: Any) -> float | None:
        """Steps left at the step rate of the current phase (from its first step event, so a
        start's loading and a pause's wait are not counted); the trainer's own ``eta_s`` before
        two steps of the phase are seen."""
        if self._step_phase is None or step < self._step_phase[1]:
            self._step_phase = (ts, step)
        since_ts, since_step = self._step_phase
        if total is not None and step >= total:
            return 0.0
        if total and ts > since_ts and step > since_step:
            return (total - step) * (ts - since_ts) / (step - since_step)
        return float(sent) if isinstance(sent, (int, float)) else None

    def _averages(self, now: float) -> dict[str, float | None]:
        """Rows, tokens and bytes per second over every run's time this file shows: a resumed
        run's averages span its earlier runs too (rows an earlier run not in the file had done are
        left out, with its time)."""
        start = self.wall_start_ts  # each run from its process's start (its load counts, as in elapsed)
        work_s = self._earlier_runs_s + ((self.terminal_ts or now) - start) if start else 0.0
        rows_before, tokens_before = self._counted_before or (0, 0)
        done = {"rows": self.rows_done - rows_before, "tokens": self.tokens_done - tokens_before,
                "bytes": self.bytes_done}
        return {f"{name}_per_s_avg": (max(0, value) / work_s if work_s > 0 else None)
                for name, value in done.items()}

    def snapshot(self, now: float) -> ProgressSections:
        """The ``events`` and ``progress`` sections, and ``training`` (None when not a training)."""
        with self._lock:
            rows_per_s = self._rows_rate.rate()
            tokens_per_s = self._tokens_rate.rate()
            eta = low = high = None
            planned = job_eta(self._rows_eta, self._tokens_eta, self.rows_done, self.rows_total,
                              self.tokens_done, self.tokens_total)
            if self.terminal_kind == ev.DONE:
                eta = 0.0  # a time-limited training ends before its schedule says
            elif self.terminal_kind is not None:
                pass  # stopped: no ETA on a job that ended
            elif self.training and self.training.get("total_steps"):
                eta = self.training.get("eta_s")  # steps, not rows: a training passes its rows E times
            elif planned is not None:
                eta, low, high = planned.eta_s, planned.low_s, planned.high_s
            elif self.rows_total is not None and rows_per_s:
                eta = max(0, self.rows_total - self.rows_done) / rows_per_s
            elif self.training and self.training.get("eta_s") is not None:
                eta = self.training["eta_s"]
            progress = Progress(
                rows_done=self.rows_done,
                rows_total=self.rows_total,
                tokens_done=self.tokens_done,
                tokens_total=self.tokens_total,
                chunks_done=self.chunks_done,
                chunks_total=self.chunks_total,
                rejects=self.rejects,
                rejects_by_reason=dict(self.rejects_by_reason),
                rows_per_s=rows_per_s,
                tokens_per_s=tokens_per_s,
                bytes_per_s=self._bytes_rate.rate(),
                elapsed_s=((self.terminal_ts or now) - self.wall_start_ts) if self.wall_start_ts else None,
                eta_s=eta,
                last_progress_ts=self.last_progress_ts,
                eta_low_s=low,
                eta_high_s=high,
                **self._averages(now),
            )
            events = EventsSection(
                path=self.path,
                exists=self.exists,
                lines=self.reader.lines,
                bad_lines=self.reader.bad_lines,
                rotations=self.reader.rotations,
                last_event_ts=self.last_event_ts,
                last_kind=self.last_kind,
                log=self.log_path,
                log_lines=self.log_lines if self.log_path else None,
            )
            training = dict(self.training) if self.training else None
            if training is not None and training.get("tokens_per_s") is None:
                training["tokens_per_s"] = tokens_per_s
            return ProgressSections(
                progress=progress,
                events=events,
                # the trainer's values as it wrote them (status_doc.TrainingSection)
                training=msgspec.convert(training, TrainingSection) if training is not None else None,
                recent_events=list(self.recent)[-20:],
                started_as=self.started_as,
            )


@dataclass
class ProgressSections:
    """What the events file gives the job's status: its ``progress``, ``events`` and ``training``
    sections and its recent events (oldest first)."""

    progress: Progress
    events: EventsSection
    training: TrainingSection | None
    recent_events: list[dict[str, Any]]
    started_as: str | None = None


def started_as(start: dict[str, Any]) -> str | None:
    """The job kind a start event shows: ``hsmon train`` starts with backend "train", ``hsmon
    regenerate`` with its task, ``hsmon extract`` with the capture layers it writes; None for any
    other writer."""
    if start.get("backend") == "train":
        return "train"
    if start.get("task") == "regenerate":
        return "regenerate"
    if isinstance(start.get("layers"), list) and isinstance(start.get("out_dir"), str):
        return "extract"
    return None

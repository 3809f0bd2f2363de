"""An online job: the output directory is a spool (the spool contract, hsmon/contracts/spool.py) that a
following trainer consumes while the extraction writes it.

`OnlineTracker` measures the spool and its trainer for the job that watches the extraction: the
limit (SPOOL/hsmon-spool.json, read again every ``LIMIT_EVERY_S``: a resume may change it), the
trainer's ledger (hsmon.contracts.spool.LedgerReader without per-row counts: its memory does not
grow with the rows), the trainer's contract-1 events (SPOOL/hsmon-train-events.jsonl, read by the
same ProgressTracker as any job's events) and the trainer's process (the PID its events or ledger
name). The spool's rows and bytes are the output tracker's figures of the same tick (no second
read of the manifests); its level is hsmon.contracts.spool_fill's, as the extractor's and the
trainer's. Its ``section`` is the facts (hsmon.core.state_online.OnlineFacts); the
verdict and the typed section (hsmon/status_doc/online.py) come from `decide`. Cost per tick:
an idle poll is a ``stat`` of the ledger and of the events file, and one of the trainer's process.
"""

from __future__ import annotations

import os
from collections import deque

from hsmon.contracts import spool, spool_fill
from hsmon.core.config import ProcessSpec
from hsmon.core.state_online import WINDOW_S, OnlineFacts, TrainerFacts
from hsmon.core.trackers.processes import ProcessTracker
from hsmon.core.trackers.progress import ProgressTracker
from hsmon.core.trackers.rates import RateWindow
from hsmon.status_doc import OutputSection

LIMIT_EVERY_S = 5.0


class WaitShare:
    """The share of the last ``window`` seconds a flag was set, from samples taken each tick
    (only its changes are kept: memory bounded by the flips in the window)."""

    def __init__(self, window: float = WINDOW_S) -> None:
        self.window = window
        self._changes: deque[tuple[float, bool]] = deque()  # (since, flag), oldest first
        self.since: float | None = None  # the flag set since (None: not set)

    def add(self, now: float, flag: bool) -> None:
        if not self._changes or self._changes[-1][1] != flag:
            self._changes.append((now, flag))
            self.since = now if flag else None
        while len(self._changes) > 1 and self._changes[1][0] <= now - self.window:
            self._changes.popleft()

    def share(self, now: float) -> tuple[float | None, float]:
        """(share of the span set, the span covered: up to the window); (None, 0) before a sample."""
        if not self._changes:
            return None, 0.0
        start = max(self._changes[0][0], now - self.window)
        span = now - start
        if span <= 0:
            return (1.0 if self._changes[-1][1] else 0.0), 0.0
        held = 0.0
        for i, (since, flag) in enumerate(self._changes):
            until = self._changes[i + 1][0] if i + 1 < len(self._changes) else now
            if flag:
                held += max(0.0, until - max(since, start))
        return held / span, span


class OnlineTracker:
    """The spool and the trainer that follows it (see the module's docstring)."""

    name = "online"

    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir
        self.limit: int | None = None
        self._limit_read_at: float | None = None
        self.ledger = spool.LedgerReader(out_dir, track_passes=False)
        self.train = ProgressTracker(str(spool.train_events_path(out_dir)))
        self.proc: ProcessTracker | None = None
        self._cpu: float | None = None
        self.last_busy_ts: float | None = None
        self._trainer_seen_pid: int | None = None
        self.spool_wait, self.rows_wait = WaitShare(), WaitShare()
        self.producer_rate, self.consumer_rate = RateWindow(120.0), RateWindow(120.0)

    def _seen_trainer(self, alive: bool | None) -> bool:
        """Whether this PID was ever seen here as the trainer (alive, with a trainer's command line)."""
        if alive:
            self._trainer_seen_pid = self.proc.spec.pid if self.proc is not None else None
        return self.proc is not None and self._trainer_seen_pid == self.proc.spec.pid

    @property
    def is_spool(self) -> bool:
        return self.limit is not None or self.ledger.ledger.starts > 0

    def poll(self, now: float) -> None:
        if self._limit_read_at is None or now - self._limit_read_at >= LIMIT_EVERY_S:
            self._limit_read_at = now
            self.limit = spool.read_spool_limit(self.out_dir)
        if not self.is_spool and not os.path.exists(spool.ledger_path(self.out_dir)):
            return  # no spool (yet): a stat per tick, the limit file read every LIMIT_EVERY_S
        self.ledger.poll()
        self.train.poll()
        self._poll_process(now)

    def _poll_process(self, now: float) -> None:
        pid = self.train.pid or self.ledger.ledger.trainer_pid
        if pid is None:
            return
        if self.proc is None:
            self.proc = ProcessTracker(ProcessSpec("trainer", pid=pid))
        elif self.proc.spec.pid != pid:
            self.proc.set_pid(pid)
            self._cpu = None
        snap = self.proc.poll()
        cpu = snap.get("cpu_seconds")
        if isinstance(cpu, (int, float)) and _is_trainer(self.proc.entry().cmdline):
            if self._cpu is not None and cpu > self._cpu + 0.05:
                self.last_busy_ts = now
            self._cpu = cpu

    def facts(self, now: float, out: OutputSection | None, producer_paused: str | None) -> OnlineFacts | None:
        """This tick's facts (None when the directory is no spool), from the output section of the tick."""
        if not self.is_spool:
            return None
        ledger = self.ledger.ledger
        rows = (out.rows if out is not None else None) or 0
        row_bytes = (out.bytes if out is not None else None) or 0
        level = spool_fill.ledger_level(row_bytes, rows, ledger, self.limit)
        self.producer_rate.add(now, rows)
        self.consumer_rate.add(now, ledger.consumed_rows)
        trainer_waits = self.train.paused_reason == spool.PAUSE_ROWS and self.train.terminal_kind is None
        self.spool_wait.add(now, producer_paused == spool.PAUSE_SPOOL)
        self.rows_wait.add(now, trainer_waits)
        spool_frac, span = self.spool_wait.share(now)
        rows_frac, _ = self.rows_wait.share(now)
        return OnlineFacts(
            path=self.out_dir, limit_bytes=self.limit, spool_bytes=level.waiting_bytes,
            rows_written=rows, rows_consumed=ledger.consumed_rows, passes=ledger.passes_target,
            consume=ledger.consume, trainer_step=_step(self.train.training) or ledger.step or None,
            trainer_arch=self.train.arch,
            producer_rows_per_s=self.producer_rate.rate(), consumer_rows_per_s=self.consumer_rate.rate(),
            spool_wait_frac=spool_frac, rows_wait_frac=rows_frac if self.train.exists else None,
            window_s=span, producer_paused_since_ts=self.spool_wait.since,
            spool_full=self.limit is not None and level.full,
            trainer=self._trainer(ledger),
            chunks_complete=out.chunks_complete if out is not None else None,
            chunks_consumed=len(ledger.consumed_chunks),
            trainer_eta_s=None if self.train.terminal_kind else (self.train.training or {}).get("eta_s"),
            trainer_training=self.train.training,
            trainer_process=self.proc.entry() if self.proc is not None and self._trainer_here() else None)

    def _trainer_here(self) -> bool:
        """Whether the PID the trainer's events or ledger name is the trainer on this host (seen
        alive here with a trainer's command line), so that the job lists it among its processes."""
        return self.proc is not None and self._trainer_seen_pid == self.proc.spec.pid

    def _trainer(self, ledger: spool.Ledger) -> TrainerFacts:
        tr, proc = self.train, self.proc
        alive, seen = None, False
        if proc is not None:
            entry = proc.entry()
            alive = entry.alive and entry.status != "zombie"
            if alive and not _is_trainer(entry.cmdline):
                alive = None  # that PID here is another program: the trainer runs on another host
            seen = proc.seen_alive and self._seen_trainer(alive)
        ended = tr.terminal_kind or ledger.ended
        return TrainerFacts(
            seen=tr.exists or ledger.starts > 0, started=tr.started or ledger.starts > 0,
            pid=tr.pid or ledger.trainer_pid, alive=alive, status=proc.entry().status if proc else "gone",
            seen_alive=seen, ended=ended, ended_reason=ledger.ended_reason, paused_reason=tr.paused_reason,
            waiting_since_ts=self.rows_wait.since,
            last_progress_ts=_latest(tr.last_progress_ts, ledger.last_ts),
            last_busy_ts=self.last_busy_ts, last_error=tr.last_error,
            step=_step(tr.training) or ledger.step or None)


def _is_trainer(cmdline: str) -> bool:
    """Whether a command line is a trainer's (`hsmon train`, torchrun of it, a site wrapper naming it)."""
    return "train" in cmdline.lower()


def _step(training: dict | None) -> int | None:
    step = (training or {}).get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _latest(*stamps: float | None) -> float | None:
    known = [t for t in stamps if t is not None]
    return max(known) if known else None

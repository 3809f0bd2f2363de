"""An online job's verdict: the extraction writing a spool and the trainer following it, judged
together. Pure: the facts come from hsmon/core/trackers/online.py, the extraction's own
verdict from `decide` (hsmon/core/state.py), which calls `online_decision` last.

Each side gets a state (hsmon/status_doc/online.py ``SIDE_STATES``):
- the extractor paused for spool room is ``paused``, never stalled: the trainer is the slower side;
- a trainer paused for rows (its ``pause`` event, reason ``rows``) is ``waiting``, never stalled;
- a trainer alive whose steps stopped but whose CPU moves is ``running`` (slow, not stuck); with
  neither moving for stall_after it is ``stalled``; seen alive here and gone without a done/stopped
  it is ``dead``. A trainer this host never saw (on another host: the spool is shared) is judged by
  its steps and ledger alone: stalled when they stop for stall_after, never dead by a PID.

The job's state: a dead or stalled trainer pages the trainer (``dead``/``stalled``, reason and hint
naming it) even while the extraction waits for room; a dead or stalled extraction pages as any
extraction does; an extraction paused for room while the trainer consumes is ``running`` (the
pipeline moves; its pauses are the bottleneck's words, not alerts); both sides waiting on each
other for stall_after is ``stalled`` (the pipeline stopped); an extraction that finished while the
trainer goes on takes the trainer's state; the job is ``done`` when both are, ``stopped`` when a side
stopped on request (or by a signal) and neither moves any more. A trainer that ended (done or stopped:
--max-steps, --time-limit, a signal) while rows wait and the extraction still writes carries the
``trainer-ended`` hint (critical with a spool limit: it pages); with the extractor waiting for room
the job is ``stopped`` (nothing will make room).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from hsmon.contracts.units import format_bytes
from hsmon.core.state_facts import Decision, Hint, age, fmt_seconds
from hsmon.status_doc.job import ProcessEntry, TrainingSection
from hsmon.status_doc.online import OnlineSection, OnlineSide

# a side that waited at least this share of the window is named the bottleneck
BOTTLENECK_SHARE = 0.05
WINDOW_S = 600.0


@dataclass
class TrainerFacts:
    """The following trainer as measured: its events (SPOOL/hsmon-train-events.jsonl), its ledger
    and its process (the PID its start event or ledger names)."""

    seen: bool = False  # its events or its ledger exist
    started: bool = False  # a start event (or ledger start record) was seen
    pid: int | None = None
    alive: bool | None = None  # None: no PID known to look at
    status: str = "gone"
    seen_alive: bool = False
    ended: str | None = None  # done | stopped (its events or its ledger)
    ended_reason: str | None = None  # the ledger's: done, max_steps, out_of_time, stopped
    paused_reason: str | None = None
    waiting_since_ts: float | None = None  # paused for rows since
    last_progress_ts: float | None = None  # a step (or any counting event) last arrived
    last_busy_ts: float | None = None  # its CPU time last moved
    last_error: str | None = None
    step: int | None = None  # its last step (events or ledger)


@dataclass
class OnlineFacts:
    """An online job's spool and both sides' figures, measured this tick."""

    path: str
    limit_bytes: int | None
    spool_bytes: int
    rows_written: int
    rows_consumed: int
    passes: int | None = None
    consume: bool = False
    trainer_step: int | None = None
    trainer_arch: str | None = None  # the drafter architecture the trainer's start event names
    producer_rows_per_s: float | None = None
    consumer_rows_per_s: float | None = None
    spool_wait_frac: float | None = None  # share of the window the extractor waited for room
    rows_wait_frac: float | None = None  # share of the window the trainer waited for rows
    window_s: float = 0.0
    producer_paused_since_ts: float | None = None  # paused for spool room since
    # no events watched (a spool watched by --out alone) and no room for a row of the mean size:
    # the extractor waits for room (with its events watched, its pause event says so instead)
    spool_full: bool = False
    trainer: TrainerFacts = field(default_factory=TrainerFacts)
    chunks_complete: int | None = None  # complete chunks the manifests record (None: not known)
    producer_eta_s: float | None = None  # the extraction's ETA (rows left at its rate)
    trainer_eta_s: float | None = None  # the trainer's ETA (steps left at the step rate of its phase)
    trainer_process: ProcessEntry | None = None  # the trainer's process, as the job's processes list it
    chunks_consumed: int = 0  # chunks the ledger's consumed records name
    trainer_training: dict[str, Any] | None = None  # the trainer's figures from its events


def _window(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def bottleneck(f: OnlineFacts, producer: str, consumer: str) -> str:
    """Which side is slower, in words."""
    waiting = max(0, f.rows_written - f.rows_consumed)
    if producer == "done":
        if consumer == "done":
            return "both sides finished"
        return f"extraction finished; training goes on ({waiting} rows waiting)"
    spool, rows, win = f.spool_wait_frac or 0.0, f.rows_wait_frac or 0.0, _window(f.window_s)
    if spool >= BOTTLENECK_SHARE and spool >= rows:
        return (f"training is the bottleneck: extraction waited for spool room {100 * spool:.0f} % "
                f"of the last {win}")
    if rows >= BOTTLENECK_SHARE:
        return f"extraction is the bottleneck: training waited for rows {100 * rows:.0f} % of the last {win}"
    if consumer in ("starting", "dead", "done"):
        return f"no trainer is consuming ({consumer}); the spool holds {waiting} rows"
    rates = _rates(f)
    return f"neither side waited in the last {win}{': ' + rates if rates else ''}"


def _rates(f: OnlineFacts) -> str:
    if f.producer_rows_per_s is None or f.consumer_rows_per_s is None:
        return ""
    return f"extraction {f.producer_rows_per_s:.2f} rows/s, training {f.consumer_rows_per_s:.2f} rows/s"


def producer_side(f: OnlineFacts, base: Decision, paused_reason: str | None) -> OnlineSide:
    """The extractor's side, from the extraction's own verdict."""
    state = {"silent": "running", "quiet": "stalled", "exited": "dead"}.get(base.state, base.state)
    reason = base.reason
    limit = f" (limit {format_bytes(f.limit_bytes)})" if f.limit_bytes else ""
    if state == "paused" and paused_reason == "spool":
        reason = f"spool full: {format_bytes(f.spool_bytes)} of rows waiting for the trainer{limit}"
    elif state == "stalled" and paused_reason is None and f.spool_full:
        # nothing moves because there is no room: its pause event is not watched, the spool says so
        state = "paused"
        reason = (f"spool full: {format_bytes(f.spool_bytes)} of rows waiting for the trainer{limit}; "
                  "seen from the spool (no pause event watched)")
    return OnlineSide(role="extractor", state=state, reason=reason, rows_per_s=f.producer_rows_per_s,
                      wait_frac=f.spool_wait_frac, eta_s=_eta(state, f.producer_eta_s))


def consumer_side(f: OnlineFacts, now: float, stall_after: float) -> OnlineSide:
    """The trainer's side."""
    t = f.trainer
    state, reason = _consumer_state(t, now, stall_after, f.path)
    return OnlineSide(role="trainer", state=state, reason=reason, rows_per_s=f.consumer_rows_per_s,
                      pid=t.pid, wait_frac=f.rows_wait_frac, eta_s=_eta(state, f.trainer_eta_s))


def _eta(state: str, eta: float | None) -> float | None:
    """A side's ETA: none once it ended (0 when done), its own while it runs."""
    if state == "done":
        return 0.0
    return None if state in ("stopped", "dead") else (round(eta, 1) if eta is not None else None)


def _consumer_state(t: TrainerFacts, now: float, stall: float, path: str) -> tuple[str, str]:
    what = f"trainer PID {t.pid}" if t.pid else "the trainer"
    if not t.seen:
        return "starting", f"no trainer follows {path} yet (start `hsmon train {path} --follow --passes E`)"
    at = f" at step {t.step}" if t.step is not None else ""
    early = {"max_steps": "--max-steps", "out_of_time": "--time-limit"}.get(t.ended_reason or "")
    if t.ended is not None and early:  # a limit the user set: a normal end, said as which
        return "done", f"training ended by {early}{at}"
    if t.ended == "done":
        return "done", "training finished"
    if t.ended is not None:
        return "stopped", f"training stopped on request{at}"
    if t.alive is False and t.seen_alive:  # seen alive here, now gone (not merely on another host)
        detail = f" (last error: {t.last_error})" if t.last_error else ""
        return "dead", f"{what} is gone without a done record{detail}"
    if t.status == "zombie":
        return "dead", f"{what} is a zombie"
    if t.paused_reason == "rows":
        since = age(now, t.waiting_since_ts)
        return "waiting", "waiting for rows" + (f" for {fmt_seconds(since)}" if since is not None else "")
    progress, busy = age(now, t.last_progress_ts), age(now, t.last_busy_ts)
    if progress is not None and progress <= stall:
        return "running", f"a step {fmt_seconds(progress)} ago"
    if busy is not None and busy <= stall:
        no_step = f"no step for {fmt_seconds(progress)}" if progress is not None else "no step yet"
        return "running", f"CPU busy {fmt_seconds(busy)} ago, {no_step} (slow, not stuck)"
    if not t.started:
        return "starting", "its events have no start yet"
    if t.status == "stopped":
        return "stalled", f"{what} is stopped (SIGSTOP): resume it with `kill -CONT {t.pid}`"
    quiet = min(a for a in (progress, busy, stall) if a is not None)
    where = f"; PID {t.pid} is not a trainer on this host (gone, or on another host)" if t.alive is not True \
        and t.pid else ""
    return "stalled", f"no step and no CPU for {fmt_seconds(quiet)} (stall-after {fmt_seconds(stall)}){where}"


def online_decision(f: OnlineFacts, base: Decision, now: float, stall_after: float,
                    paused_reason: str | None) -> tuple[Decision, OnlineSection]:
    """The online job's decision (from the extraction's ``base``) and its status section."""
    producer = producer_side(f, base, paused_reason)
    consumer = consumer_side(f, now, stall_after)
    section = OnlineSection(
        path=f.path, limit_bytes=f.limit_bytes, spool_bytes=f.spool_bytes, rows_written=f.rows_written,
        rows_consumed=f.rows_consumed, rows_waiting=max(0, f.rows_written - f.rows_consumed),
        passes=f.passes, consume=f.consume, trainer_step=f.trainer_step, trainer_arch=f.trainer_arch,
        producer=producer,
        consumer=consumer, bottleneck=bottleneck(f, producer.state, consumer.state), window_s=f.window_s,
        training=_training(f.trainer_training))
    return _job_decision(f, base, producer, consumer, now, stall_after), section


def _training(figures: dict[str, Any] | None) -> TrainingSection | None:
    """The trainer's figures as a training section; its ETA is the consumer side's."""
    if not figures:
        return None
    return msgspec.convert({**figures, "eta_s": None}, TrainingSection)


def _job_decision(f: OnlineFacts, base: Decision, producer: OnlineSide, consumer: OnlineSide,
                  now: float, stall: float) -> Decision:
    hints = list(base.hints)
    full = producer.state == "paused" and producer.reason.startswith("spool full")
    holding = "; the extractor waits for spool room until it is back" if full else ""
    if consumer.state == "dead":
        hints.append(Hint("trainer-dead", "critical",
                          f"{consumer.reason}: rerun it with --resume (`hsmon train {f.path} --follow "
                          f"--resume`); the ledger keeps every row's passes{holding}"))
        both = f"; and the extractor: {base.reason}" if producer.state == "dead" else holding
        return Decision("dead", f"{consumer.reason}{both}", hints)
    if base.state in ("dead", "exited") or (base.state == "stalled" and not full):
        return base  # the extraction pages as any extraction does
    if full and base.state in ("stalled", "quiet"):  # quiet because it waits for room, not stuck
        hints = [h for h in hints if h.id not in ("stalled", "quiet")]
        base = Decision("paused", producer.reason, hints)
    if consumer.state == "stalled":
        hints = [h for h in hints if h.id != "stalled"]
        hints.append(Hint("trainer-stalled", "critical", f"the trainer: {consumer.reason}{holding}"))
        return Decision("stalled", f"the trainer: {consumer.reason}", hints)
    if full and consumer.state == "waiting":
        stamps = (f.producer_paused_since_ts, f.trainer.waiting_since_ts)
        since = max(stamps) if None not in stamps else None  # type: ignore[type-var]
        if since is not None and now - since > stall:
            why = (f"the pipeline stopped: the spool is full ({format_bytes(f.spool_bytes)}) and the trainer "
                   f"waits for rows, both for {fmt_seconds(now - since)}: {_why_stopped(f)}")
            hints.append(Hint("pipeline-stopped", "critical", why))
            return Decision("stalled", why, hints)
    ended = _trainer_ended(f, producer, consumer, full)
    if ended is not None:
        hints.append(ended)
        if full:  # nothing will ever make room: the job stopped, and the hint pages
            return Decision("stopped", ended.message, hints)
        if consumer.state == "done":
            return Decision(base.state, base.reason, hints)
    if "stopped" in (producer.state, consumer.state):
        return _stopped_decision(f, base, producer, consumer, hints)
    if producer.state == "done":
        waited = age(now, f.trainer.waiting_since_ts)
        if consumer.state == "waiting" and waited is not None and waited > stall:
            why = (f"the trainer waits for rows for {fmt_seconds(waited)} but the extraction finished: "
                   "it should end once every row had its passes (check its log)")
            hints.append(Hint("trainer-stalled", "critical", why))
            return Decision("stalled", why, hints)
        if consumer.state == "done":
            return Decision("done", f"{base.reason}; training finished", hints)
        if consumer.state == "starting":
            return base
        return Decision("running" if consumer.state in ("running", "waiting") else consumer.state,
                        f"extraction finished; the trainer: {consumer.reason}", hints)
    if full:
        if consumer.state == "starting":
            hints.append(Hint("no-trainer", "warning", f"the spool is full and {consumer.reason}"))
            return Decision(base.state, base.reason, hints)
        return Decision("running", f"{producer.reason}; the trainer: {consumer.reason}", hints)
    return base


def _trainer_ended(f: OnlineFacts, producer: OnlineSide, consumer: OnlineSide, full: bool) -> Hint | None:
    """The ``trainer-ended`` hint: the trainer ended (done or stopped: --max-steps, --time-limit, a
    signal) while rows wait for it and the extraction still writes. With a spool limit it is critical
    (the extractor waits for room that never comes once the spool is full); without one a warning."""
    waiting = max(0, f.rows_written - f.rows_consumed)
    if consumer.state not in ("done", "stopped") or producer.state in ("done", "stopped", "dead"):
        return None
    if not f.consume or waiting == 0:
        return None
    who = f"the trainer (PID {f.trainer.pid})" if f.trainer.pid else "the trainer"
    if full:
        then = "the extractor waits for spool room that will never come"
    elif f.limit_bytes:
        then = "the extractor will wait for spool room for ever once the spool is full"
    else:
        then = "those rows will not be trained"
    fix = (f"rerun it with `hsmon train {f.path} --follow --resume` (without the --max-steps or --time-limit "
           "that ended it), or stop the extraction and resume both later")
    return Hint("trainer-ended", "critical" if f.limit_bytes else "warning",
                f"{who} ended ({consumer.reason}) while {waiting} rows wait in the spool: {then}; {fix}")


IDLE_SIDE_STATES = frozenset({"done", "stopped", "waiting", "starting", "paused"})


def _stopped_decision(f: OnlineFacts, base: Decision, producer: OnlineSide, consumer: OnlineSide,
                      hints: list[Hint]) -> Decision:
    """A side stopped on request: ``stopped`` once neither side moves, else the moving side runs on."""
    resume = (f"rerun `hsmon online` with the same arguments and --resume (or the extraction's own command "
              f"and `hsmon train {f.path} --follow --resume`); the ledger keeps every row's passes")
    if producer.state == "stopped":
        words = producer.reason.removeprefix("the job ").removeprefix("the output's manifest says the run ")
        said = f"the extraction {words.split(': ')[0]}"
    else:
        said = f"the extraction: {producer.reason}"
    trained = consumer.reason if consumer.state == "stopped" else f"the trainer: {consumer.reason}"
    if producer.state in IDLE_SIDE_STATES and consumer.state in IDLE_SIDE_STATES:
        return Decision("stopped", f"{said}; {trained}: {resume}", hints)
    moving = "the trainer" if producer.state == "stopped" else "the extraction"
    hints.append(Hint("side-stopped", "info", f"{said}; {trained}; {moving} goes on. To go on: {resume}"))
    return Decision("running", f"{said}; {trained}", hints)


def _why_stopped(f: OnlineFacts) -> str:
    """Why a full spool and a waiting trainer wait on each other, and what to do."""
    left = (f.chunks_complete or 0) - f.chunks_consumed
    if not f.consume:
        return ("the trainer does not consume (no --consume), so no row ever leaves the spool; restart it "
                "with --consume (`hsmon train SPOOL --follow --consume --resume`)")
    if left > 0:
        return (f"{left} complete chunk(s) the trainer has not consumed are in the spool, so the limit "
                "is not the cause; restart the trainer with --resume (it consumes the chunks its "
                "checkpoint finished before it waits for rows)")
    return ("the spool holds no complete chunk the trainer can take; raise --spool-max or lower "
            "--chunk-size, then resume the extraction")

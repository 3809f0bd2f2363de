"""One job's status (hsmon.status_doc.JobStatus), built in one step from its trackers' sections
and its state after the decision; hsmon/core/job_runtime.py calls it once per tick."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import msgspec

from hsmon.contracts import events as ev
from hsmon.core.config import JobConfig
from hsmon.core.state_facts import Decision, Hint
from hsmon.status_doc import (
    ENDED_STATES,
    DiskEntry,
    DumpSection,
    EventsSection,
    JobGpu,
    JobStatus,
    LogFile,
    OnlineSection,
    OutputSection,
    ProcessEntry,
    Progress,
    RegenerateSection,
    ServerEntry,
    StateEvent,
    TrainingSection,
)


@dataclass
class JobState:
    """Where the job's state machine stands; the job's runtime keeps one and moves it after each
    decision (``move_to``), and the status is built from it as it stands."""

    since_ts: float
    state: str | None = None  # None until the first decision
    reason: str = ""
    hints: list[Hint] = field(default_factory=list)
    transitions_total: int = 0
    transitions_by_state: dict[str, int] = field(default_factory=dict)
    events: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=20))  # oldest first

    def move_to(self, decision: Decision, now: float, job: str) -> str | None:
        """Move to the decided state; returns the previous state when it changed ("none" for the
        first state), else None."""
        new = decision.state
        self.reason, self.hints = decision.reason, list(decision.hints)
        if new == self.state:
            return None
        # a job is shown "starting" from its construction (``not_measured``): its first decision
        # "starting" keeps that clock, or a reader sees the clock of an unchanged state move
        first_start = self.state is None and new == "starting"
        previous, self.state = self.state, new
        if not first_start:  # from the job's own record (when it really ended) where it has one
            own = decision.since_ts
            self.since_ts = own if own is not None and own <= now else now
        self.transitions_total += 1
        self.transitions_by_state[new] = self.transitions_by_state.get(new, 0) + 1
        self.events.append(
            ev.make_event(ev.STATE, job, ts=self.since_ts, state=new, previous=previous,
                          reason=decision.reason)
        )
        return previous or "none"


@dataclass
class Sections:
    """What the trackers measured this tick, as they return it."""

    progress: Progress | None = None  # the events' progress, merged with the output's
    dump: DumpSection | None = None  # the tracker's own type
    output: OutputSection | None = None  # the output tracker's own type
    disk: list[DiskEntry] = field(default_factory=list)  # the disk tracker's own type
    processes: list[ProcessEntry] = field(default_factory=list)  # the process tracker's own type
    events: EventsSection | None = None  # the progress tracker's own types
    recent_events: list[dict[str, Any]] = field(default_factory=list)
    training: TrainingSection | None = None
    servers: list[ServerEntry] = field(default_factory=list)  # the server tracker's own type
    gpu_indices: list[int] = field(default_factory=list)
    gpu_idle_since_ts: float | None = None
    last_work_ts: float | None = None  # the activity clocks (hsmon/core/job_activity.py)
    last_busy_ts: float | None = None
    started_as: str | None = None  # the kind the job's start event shows
    online: OnlineSection | None = None  # made with the verdict (hsmon/core/state_online.py)
    regenerate: RegenerateSection | None = None  # a regeneration's figures (trackers/regenerate.py)
    logs: list[LogFile] = field(default_factory=list)  # where the job's output goes (job_logs)


def job_status(cfg: JobConfig, st: JobState, sec: Sections) -> JobStatus:
    """The job's whole section of the status document (a job that ended has no ETA left)."""
    if st.state in ENDED_STATES:
        sec = _without_eta(sec, 0.0 if st.state == "done" else None)
    history = list(st.events)
    recent = sorted(sec.recent_events + history, key=lambda e: e.get("ts") or 0)[-20:]
    return JobStatus(
        job=cfg.name,
        # a job configured without a kind (watched through its events) is what it says it is
        kind=sec.started_as if cfg.kind == "external" and sec.started_as else cfg.kind,
        state=st.state or "starting",
        state_since_ts=st.since_ts,
        reason=st.reason,
        hints=list(st.hints),
        transitions_total=st.transitions_total,
        state_history=msgspec.convert(history, list[StateEvent]),
        stall_after_s=cfg.stall_after,
        last_work_ts=sec.last_work_ts,
        last_busy_ts=sec.last_busy_ts,
        progress=sec.progress,
        dump=sec.dump,
        output=sec.output,
        disk=list(sec.disk),
        processes=list(sec.processes),
        events=sec.events,
        recent_events=recent,
        training=sec.training,
        servers=list(sec.servers),
        gpu=JobGpu(indices=list(sec.gpu_indices), idle_since_ts=sec.gpu_idle_since_ts),
        online=sec.online if sec.online is not None else msgspec.UNSET,
        regenerate=sec.regenerate if sec.regenerate is not None else msgspec.UNSET,
        logs=list(sec.logs) if sec.logs else msgspec.UNSET,
    )


def _without_eta(sec: Sections, eta: float | None) -> Sections:
    """``sec`` with ``eta`` as the progress's ETA, none in the training section and no disk
    projection (copies)."""
    from dataclasses import replace

    progress = sec.progress
    if progress is not None and (progress.eta_s != eta or progress.eta_low_s or progress.eta_high_s):
        progress = msgspec.structs.replace(progress, eta_s=eta, eta_low_s=None, eta_high_s=None)
    training = sec.training
    if training is not None and training.eta_s is not None:
        training = msgspec.structs.replace(training, eta_s=None)
    # an ended job writes no more: no time to full (its last minute's write rate) nor to done
    disk = [msgspec.structs.replace(d, time_to_full_s=None, time_to_done_s=None) for d in sec.disk]
    return replace(sec, progress=progress, training=training, disk=disk)


def not_measured(cfg: JobConfig, now: float) -> JobStatus:
    """A job added but not measured yet: starting, every section empty."""
    return job_status(cfg, JobState(now, reason="not measured yet"), Sections())


def with_live(doc: JobStatus, dump: DumpSection | None, servers: list[ServerEntry] | None) -> JobStatus:
    """``doc`` with the dump directory and servers read now (their threads move between ticks)."""
    changes: dict[str, Any] = {}
    if dump is not None:
        changes["dump"] = dump
    if servers:
        changes["servers"] = servers
    return msgspec.structs.replace(doc, **changes) if changes else doc

"""What the job state machine reads and returns: the snapshot of plain figures the monitor
measured (`Snapshot` with its process and server facts), the states, hints and the decision.

Types only (and two formatting helpers): hsmon/core/state.py decides, hsmon/core/state_engine.py and
hsmon/core/state_data.py add the engine's and the data's hints, all from these facts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hsmon.contracts.data_facts import DataSummary
from hsmon.core.verify_watch import VerifyResult
from hsmon.status_doc.job import Hint  # the status document's own type: one hint type
from hsmon.status_doc.online import OnlineSection

STATES = ("starting", "running", "silent", "stalled", "dead", "paused", "done", "exited", "quiet", "unknown",
          "stopped")
ALERT_STATES = frozenset({"stalled", "dead", "paused", "done", "exited", "stopped"})


@dataclass
class ProcessFacts:
    role: str
    pid: int | None
    alive: bool
    status: str  # running | sleeping | stopped | zombie | gone
    seen_alive: bool = False  # this process role was alive at some point while watched
    stdout: str | None = None
    stdout_buffered: bool = False
    cmdline: str = ""
    oom_kill: str | None = None  # gone: the kernel's word that its OOM killer killed it
    oom_in_cgroup: str | None = None  # gone: its shared cgroup counted an OOM kill naming no one (a hint)


@dataclass
class StopFacts:
    """How far a job got when it stopped on request, from its ``stopped`` event (or its manifest's
    ``stopped`` record): what a ``stopped`` reason says besides the counts the snapshot has."""

    how: str | None = None  # "SIGINT", "SIGTERM", "signal" (an older writer), "request"
    step: int | None = None  # a training's step when it stopped
    total_steps: int | None = None
    resume: str | None = None  # the writer's own word on the command that resumes it

    @classmethod
    def of_event(cls, e: dict[str, Any] | None) -> StopFacts | None:
        """From a ``stopped`` event (fields an older writer lacks stay None); None for another."""
        if not e or e.get("kind") != "stopped":
            return None

        def num(key: str) -> int | None:
            v = e.get(key)
            return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

        def text(key: str) -> str | None:
            v = e.get(key)
            return v[:300] if isinstance(v, str) and v else None

        step = num("step") if e.get("rows_total") is None else None  # a training counts steps
        return cls(how=text("signal") or text("reason"), step=step, total_steps=num("total_steps"),
                   resume=text("resume"))


@dataclass
class DoneFacts:
    """What ended a run that reported done, from its ``done`` event: a limit the user set (the
    training's ``--time-limit`` or ``--max-steps``) rather than its whole work, and how far it got."""

    limit: str | None = None  # "--time-limit", "--max-steps"; None: the work was done
    step: int | None = None
    total_steps: int | None = None

    @classmethod
    def of_event(cls, e: dict[str, Any] | None) -> DoneFacts | None:
        if not e or e.get("kind") != "done":
            return None
        ended_by = e.get("ended_by")
        limit = {"time_limit": "--time-limit", "max_steps": "--max-steps"}.get(str(ended_by))
        if limit is None and e.get("time_limit_reached") is True:  # a trainer older than ended_by
            limit = "--time-limit"

        def num(key: str) -> int | None:
            v = e.get(key)
            return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

        return cls(limit=limit, step=num("step"), total_steps=num("total_steps"))


@dataclass
class ServerFacts:
    """One inference server the job talks to (hsmon/core/trackers/server.py measures it)."""

    url: str
    state: str  # up | busy | hung | down | unknown
    detail: str = ""
    last_forward_ts: float | None = None  # a forward last completed (None: never seen)
    watch_start_ts: float | None = None  # watched since
    decode_ts: float | None = None  # generation tokens last moved beyond hsmon's own checks


@dataclass
class Snapshot:
    """Everything the decision needs, measured by the monitor at ``now``."""

    now: float
    stall_after: float
    watch_start_ts: float
    processes: list[ProcessFacts] = field(default_factory=list)
    process_watched: bool = False  # a pid/pidfile/match (or the events' pid) is configured
    events_watched: bool = False
    # From the events file:
    started: bool = False  # a start event was seen
    terminal_kind: str | None = None  # done | stopped (after the last start)
    terminal_ts: float | None = None
    stopped: StopFacts | None = None  # the ``stopped`` event's word (terminal_kind "stopped")
    done: DoneFacts | None = None  # the ``done`` event's word (terminal_kind "done")
    events_start_ts: float | None = None  # the last start event's time
    paused_reason: str | None = None
    last_progress_ts: float | None = None  # last event that moved a counter
    last_error: str | None = None
    # From the other trackers (the monitor's clock of when each last moved; None: never):
    last_work_ts: float | None = None  # dump files created/consumed, output grew
    work_what: str = "dump/output moved"  # what moved then (a regeneration's servers: decoding)
    last_busy_ts: float | None = None  # CPU or I/O above the idle threshold
    evidence_of_job: bool = False  # any output, dump file or event exists
    bad_event_lines: int = 0
    disk_fits: bool | None = None
    disk_message: str | None = None
    shm_fits: bool | None = None
    shm_message: str | None = None
    dump_oldest_age_s: float | None = None
    # watched paths that do not exist: (the option that names it, the path), e.g. ("--out", "/no/such")
    missing_paths: list[tuple[str, str]] = field(default_factory=list)
    # How a process ended (a process gone; see ``_ended_without_word``):
    runner_alive: bool = False  # `hsmon run` started it and is still recording how it ended
    exit_log: str | None = None  # where its stdout/stderr went (regular files), or hsmon run's log
    exit_log_tail: list[str] | None = None  # the last lines of that log, read once after it was gone
    rows_done: int | None = None  # rows written (events or output directory, the larger)
    rows_total: int | None = None  # rows expected (events, --rows-total/config, the output's plan)
    # From the output directory's manifests (hsmon layout; None where the layout carries no plan):
    output_ending: str | None = None  # done | stopped: every manifest's latest run ended so
    output_ending_ts: float | None = None
    output_run_seconds: float | None = None
    # The engine (hsmon/core/trackers/server.py, gpu.py):
    servers: list[ServerFacts] = field(default_factory=list)
    gpu_indices: list[int] = field(default_factory=list)  # GPUs the job's processes hold memory on
    gpu_idle_since_ts: float | None = None  # every one of those GPUs at 0 % since then
    # What the hidden states written look like (hsmon/contracts/data_facts.py; None: no hsmon manifest):
    data: DataSummary | None = None
    # The engine check's last verdict (hsmon/core/verify_watch.py; None: --verify-every not set):
    verify: VerifyResult | None = None
    # An online job's spool and its following trainer (hsmon/core/state_online.py; None: no spool):
    online: Any = None  # state_online.OnlineFacts


@dataclass
class Decision:
    state: str
    reason: str
    hints: list[Hint]
    online: OnlineSection | None = None  # an online job's section, made with its verdict
    # when the state began by the job's own record (its done event, its manifest's ending), not
    # when the monitor first saw it: a run that ended 28 minutes ago reads "done for 28m"
    since_ts: float | None = None


def age(now: float, ts: float | None) -> float | None:
    """Seconds since ``ts`` (never negative); None when it never happened."""
    return None if ts is None else max(0.0, now - ts)


def fmt_seconds(seconds: float) -> str:
    """``45s`` below two minutes, else ``7m``: how the reasons say a duration."""
    return f"{seconds:.0f}s" if seconds < 120 else f"{seconds / 60:.0f}m"

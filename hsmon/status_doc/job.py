"""One job's section of the status document (``jobs[]``) and its parts measured by the job's own
trackers: progress and events (hsmon/core/trackers/progress.py), dump directory, disks, processes."""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from hsmon.status_doc.base import Num, Section
from hsmon.status_doc.engine import ServerEntry
from hsmon.status_doc.online import OnlineSection
from hsmon.status_doc.output import OutputSection
from hsmon.status_doc.regenerate import RegenerateSection
from hsmon.status_doc.training import TrainingSection

# The job states after which nothing more happens until someone starts the job again: no ETA is
# given for them (done's ``eta_s`` is 0). ``stopped``: ended on request or by a signal before its
# work was done (a reader of an older release shows it as an unknown state, never as done).
ENDED_STATES = frozenset({"done", "stopped", "dead", "exited"})


class Hint(msgspec.Struct, frozen=True):
    """Something a person should know about the job (docs/daemon.md lists the ids); the state
    rules (hsmon/core/state*.py) make them: ``Hint(id, severity, message)``."""

    id: str
    severity: str  # info | warning | critical
    message: str

    def as_dict(self) -> dict[str, str]:
        """The hint as its JSON parses."""
        return {"id": self.id, "severity": self.severity, "message": self.message}


class StateEvent(Section):
    """The monitor's own ``state`` event: a transition of the job's state."""

    v: int
    ts: float
    job: str
    kind: str  # "state"
    state: str
    previous: str | None
    reason: str


class Progress(Section):
    """How far the job is: from its events, else from its output directory."""

    rows_done: int | None
    rows_total: int | None
    tokens_done: int | None
    tokens_total: int | None
    chunks_done: int | None
    chunks_total: int | None
    rejects: int | None
    rejects_by_reason: dict[str, int] | None  # reject class -> rows
    rows_per_s: Num | None
    tokens_per_s: Num | None
    bytes_per_s: Num | None
    elapsed_s: Num | None
    eta_s: Num | None
    last_progress_ts: float | None
    # the ETA's range (hsmon/core/eta.py; null without a rate); absent (UNSET) from older daemons
    eta_low_s: Num | UnsetType | None = UNSET
    eta_high_s: Num | UnsetType | None = UNSET
    # the averages over every run's time the events show (a resumed run's rows over all its runs'
    # seconds, not over the last run's); absent (UNSET) from older daemons, null when unknown
    rows_per_s_avg: Num | UnsetType | None = UNSET
    tokens_per_s_avg: Num | UnsetType | None = UNSET
    bytes_per_s_avg: Num | UnsetType | None = UNSET


class DumpSection(Section):
    """The dump directory the server writes hidden states into and the extractor empties."""

    path: str
    exists: bool
    error: str | None
    files: int | None
    bytes: int
    oldest_age_s: float | None
    created_total: int
    consumed_total: int
    created_per_s: Num | None
    consumed_per_s: Num | None


class DiskEntry(Section):
    """Headroom of one filesystem the job fills (``role``: output | shm)."""

    role: str
    path: str
    free_bytes: int | None
    total_bytes: int | None
    needed_bytes: Num | None
    fits: bool | None
    write_bytes_per_s: Num | None
    time_to_full_s: Num | None
    time_to_done_s: Num | None
    free_inodes: int | None = None  # statvfs f_favail; null when the filesystem has no inode limit
    total_inodes: int | None = None  # statvfs f_files; null likewise
    needed_inodes: int | None = None  # output: rows left + chunk directories not started (totals known)

    def short_of_inodes(self) -> bool:
        """Whether the files still to create need more inodes than are free (then they are the limit)."""
        return (self.free_inodes is not None and self.needed_inodes is not None
                and self.needed_inodes > self.free_inodes)


class ProcessEntry(Section):
    """One process of the job (psutil's figures; ``status`` gone when not found)."""

    role: str
    pid: int | None
    alive: bool
    status: str  # running | sleeping | stopped | zombie | gone
    cpu_seconds: Num | None
    cpu_percent: Num | None
    rss_bytes: int | None
    read_bytes: int | None
    write_bytes: int | None
    read_chars: int | None
    write_chars: int | None
    threads: int | None
    start_ts: float | None
    uptime_s: float | None
    restarts: int
    cmdline: str
    stdout: str | None
    stdout_buffered: bool
    oom_kill: str | None


class EventsSection(Section):
    """The job's events file (the events contract)."""

    path: str
    exists: bool
    lines: int
    bad_lines: int
    rotations: int
    last_event_ts: float | None
    last_kind: str | None
    log: str | None
    log_lines: int | None


class JobGpu(Section):
    """The GPUs the job's processes hold memory on, and since when all of them read 0 %."""

    indices: list[int]
    idle_since_ts: float | None


class BlindTracker(Section):
    """A tracker failing call after call (hsmon/core/state_blind.py): its sections are stale."""

    tracker: str
    since_ts: float
    failures: int
    error: str  # the last one: "PermissionError: ..."
    stale: list[str]  # the job's sections it feeds, standing on old figures


class LogFile(Section):
    """A file the job's output goes to: what `hsmon tui`'s Logs view tails."""

    path: str
    what: str  # "extractor output (PID 4242)", "the command's log (hsmon run)", "the job's log"


class JobStatus(Section):
    """One job: its state and why, and every tracker's section (null when not watched)."""

    job: str
    kind: str  # extract | train | regenerate | external
    state: str
    state_since_ts: float
    reason: str
    hints: list[Hint]
    transitions_total: int
    state_history: list[StateEvent]
    stall_after_s: float
    last_work_ts: float | None
    last_busy_ts: float | None
    progress: Progress | None
    dump: DumpSection | None
    output: OutputSection | None
    disk: list[DiskEntry]
    processes: list[ProcessEntry]
    events: EventsSection | None
    recent_events: list[dict[str, Any]]  # the events as written (the events contract), and state events
    training: TrainingSection | None
    servers: list[ServerEntry]
    gpu: JobGpu
    blind: list[BlindTracker] | UnsetType = UNSET  # added after v1: optional; absent while none is blind
    # an online job's spool and both sides (status_doc/online.py); omitted for any other job
    # (readers: ``online_of(job)``)
    online: OnlineSection | UnsetType = UNSET
    # a regeneration's figures (status_doc/regenerate.py); omitted for any other job (``regenerate_of``)
    regenerate: RegenerateSection | UnsetType = UNSET
    # added after v1 (optional; omitted while none is known): the job's logs: the one its start event
    # names, then where its processes' stdout and stderr go (files only) (readers: ``logs_of(job)``)
    logs: list[LogFile] | UnsetType = UNSET


def logs_of(job: JobStatus) -> list[LogFile]:
    """The job's logs (none from an older daemon)."""
    return [] if job.logs is UNSET else job.logs

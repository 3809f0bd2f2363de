"""A job's trackers behind the one interface (hsmon.core.trackers.base.Tracker), created from a list.

Each adapter is thin: the tracker modules keep their own APIs (many tests use them); the adapter
says when the tracker is due this tick, polls it and answers its section. ``JOB_TRACKERS`` is the
list ``JobRuntime`` creates its trackers from, in polling order; a factory returns None when the
job has nothing for that tracker to watch. Adding a tracker = its module + one line here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hsmon.core.trackers import (
    disk,
    dump_dir,
    online,
    online_metrics,
    output_metrics,
    processes,
    progress,
    progress_metrics,
    regenerate,
)
from hsmon.core.trackers.base import MetricsHook, Tracker
from hsmon.status_doc import DiskEntry, DumpSection, OutputSection, ProcessEntry, Progress, ServerEntry

# the job's hsmon.core.job_runtime.JobRuntime (not imported: it imports this list)
JobRuntime = Any


@dataclass
class TickPlan:
    """What the Monitor asked of this tick (the scans due by its inotify events and its timer)."""

    scan_dump: bool = True
    scan_output: bool = True
    full_scan: bool = True
    background: bool = False


class JobTracker:
    """Base of the adapters: due every tick; ``rt`` is the job's runtime. A tracker whose section
    is computed from the others' sections of the same tick (``reads_sections``) answers after the
    runtime has gathered them (``rt.tick``)."""

    name = "tracker"
    reads_sections = False

    def __init__(self, rt: JobRuntime) -> None:
        self.rt = rt

    def due(self, now: float) -> bool:
        return True

    def poll(self, now: float) -> None:
        return None

    def section(self, now: float) -> Any:
        return None


class ProgressJob(JobTracker):
    """The events file (hsmon/core/trackers/progress.py): its progress, events and training sections."""

    name = "progress"

    def poll(self, now: float) -> None:
        assert self.rt.progress is not None
        self.rt.progress.poll()

    def section(self, now: float) -> progress.ProgressSections:
        assert self.rt.progress is not None
        return self.rt.progress.snapshot(now)

    @classmethod
    def of(cls, rt: JobRuntime) -> Tracker | None:
        return cls(rt) if rt.progress is not None else None


class ServersJob(JobTracker):
    """The job's servers (hsmon/core/trackers/server.py: each looks on its own thread)."""

    name = "server"

    def poll(self, now: float) -> None:
        self.rt.poll_servers(now)

    def section(self, now: float) -> list[ServerEntry]:
        return [t.snapshot(now) for t in self.rt.servers]


class ProcessesJob(JobTracker):
    """The job's processes (hsmon/core/trackers/processes.py); their last figures stand if a poll fails."""

    name = "processes"

    def poll(self, now: float) -> None:
        self.rt.poll_processes()
        self.rt.procs = [t.entry() for t in self.rt.processes]

    def section(self, now: float) -> list[ProcessEntry]:
        return self.rt.procs


class DumpDirJob(JobTracker):
    """The dump directory (hsmon/core/trackers/dump_dir.py): scanned when its events or the timer say."""

    name = "dump_dir"

    def due(self, now: float) -> bool:
        return self.rt.plan.scan_dump or self.rt.dump_dir_changed()

    def poll(self, now: float) -> None:
        assert self.rt.dump is not None
        self.rt.dump.scan(full=self.rt.plan.full_scan)

    def section(self, now: float) -> Any:
        assert self.rt.dump is not None
        self.rt.dump.sample_rates(now)
        return self.rt.dump.snapshot(now)

    @classmethod
    def of(cls, rt: JobRuntime) -> Tracker | None:
        return cls(rt) if rt.dump is not None else None


class OutputDirJob(JobTracker):
    """The output directory (hsmon/core/trackers/output_dir.py); a large manifest may be read on a thread."""

    name = "output_dir"

    def due(self, now: float) -> bool:
        assert self.rt.output is not None
        return self.rt.plan.scan_output or self.rt.output.loading

    def poll(self, now: float) -> None:
        assert self.rt.output is not None
        self.rt.output.scan(self.rt.plan.background)

    def section(self, now: float) -> OutputSection:
        assert self.rt.output is not None
        return self.rt.output.snapshot()

    @classmethod
    def of(cls, rt: JobRuntime) -> Tracker | None:
        return cls(rt) if rt.output is not None else None


class OnlineJob(JobTracker):
    """The spool and its following trainer (hsmon/core/trackers/online.py), when the output is a
    spool; its section is the facts the online verdict (hsmon/core/state_online.py) reads, from
    this tick's output section."""

    name = "online"
    reads_sections = True

    def __init__(self, rt: JobRuntime) -> None:
        super().__init__(rt)
        self.tracker = online.OnlineTracker(rt.cfg.out_dir)

    def poll(self, now: float) -> None:
        self.tracker.poll(now)

    def section(self, now: float) -> Any:
        tick: TickFigures = self.rt.tick
        paused = self.rt.progress.paused_reason if self.rt.progress is not None else None
        facts = self.tracker.facts(now, tick.out, paused)
        if facts is not None and self.rt.progress is not None:
            facts.spool_full = False  # its events say whether it waits for room: no guess from the level
        if facts is not None and facts.limit_bytes is not None:
            tick.spool_room = max(0, facts.limit_bytes - facts.spool_bytes)
        if facts is not None and tick.progress is not None:
            facts.producer_eta_s = tick.progress.eta_s
        return facts

    @classmethod
    def of(cls, rt: JobRuntime) -> Tracker | None:
        return cls(rt) if rt.cfg.out_dir else None


class DiskJob(JobTracker):
    """The output's and the dump directory's filesystems (hsmon/core/trackers/disk.py): read each tick;
    the headroom is figured from this tick's output and dump sections and the job's progress."""

    name = "disk"
    reads_sections = True

    def poll(self, now: float) -> None:
        self.rt.disk.poll()

    def section(self, now: float) -> list[DiskEntry]:
        tick: TickFigures = self.rt.tick
        return self.rt.disk.entries(now, tick.dump, tick.out, tick.rows_total, tick.progress, tick.spool_room)

    @classmethod
    def of(cls, rt: JobRuntime) -> Tracker | None:
        return cls(rt) if rt.disk is not None else None


@dataclass
class TickFigures:
    """This tick's sections that the ``reads_sections`` trackers read: the dump and output
    sections, the job's expected rows and its progress merged with the output's."""

    dump: DumpSection | None = None
    out: OutputSection | None = None
    rows_total: int | None = None
    progress: Progress | None = None
    spool_room: int | None = None  # a spool's room left below its limit (online): the most it still takes


# The job's trackers, in polling order (progress first: the processes follow its PID, the servers
# its start event's URLs; the disk last: it reads the output and dump sections).
JOB_TRACKERS: list[Callable[[JobRuntime], Tracker | None]] = [
    ProgressJob.of,
    ServersJob,
    ProcessesJob,
    DumpDirJob.of,
    OutputDirJob.of,
    OnlineJob.of,
    regenerate.RegenerateTracker.of,
    DiskJob.of,
]


# Each tracker's Prometheus families (a ``metrics(jobs, monitor)`` function beside the tracker),
# in the order /metrics lists them.
TRACKER_METRICS: list[MetricsHook] = [
    progress_metrics.metrics,
    dump_dir.metrics,
    output_metrics.metrics,
    disk.metrics,
    processes.metrics,
    progress_metrics.event_metrics,
    online_metrics.metrics,
    regenerate.metrics,
]

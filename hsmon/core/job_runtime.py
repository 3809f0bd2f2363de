"""One watched job: its trackers, its activity clocks, its snapshot for ``decide`` and its state.

The Monitor (hsmon/core/monitor.py) owns the threads and calls ``JobRuntime.update`` on each tick;
everything here runs on that one thread. ``doc`` is the job's typed status (hsmon.status_doc),
built in one step after the decision (hsmon/core/job_document.py) and published whole.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from msgspec import UNSET
from msgspec.structs import replace

from hsmon.core import job_trackers
from hsmon.core.config import ConfigError, JobConfig, ProcessSpec
from hsmon.core.job_activity import ActivityClocks
from hsmon.core.job_document import JobState, Sections, job_status, not_measured, with_live
from hsmon.core.job_ending import EndingWatch, job_logs, merge_output_progress
from hsmon.core.job_trackers import TickFigures, TickPlan
from hsmon.core.online_job import both_sides, slower_eta
from hsmon.core.state import decide
from hsmon.core.state_blind import blind_decision, blind_entries, stale_status
from hsmon.core.state_facts import Decision, DoneFacts, ProcessFacts, Snapshot, StopFacts
from hsmon.core.tracker_errors import TrackerErrors
from hsmon.core.trackers import disk
from hsmon.core.trackers.base import Tracker, poll_all, sections
from hsmon.core.trackers.dump_dir import DumpDirTracker
from hsmon.core.trackers.output_dir import OutputDirTracker
from hsmon.core.trackers.processes import ProcessTracker
from hsmon.core.trackers.progress import ProgressSections, ProgressTracker
from hsmon.core.trackers.rates import RateWindow
from hsmon.core.trackers.server import ServerTracker
from hsmon.core.verify_watch import VerifyWatch
from hsmon.status_doc import DiskEntry, DumpSection, JobStatus, OutputSection, ProcessEntry

log = logging.getLogger("hsmon.monitor")


def _kind_of_output(out: OutputSection | None) -> str | None:
    """The job kind an output directory shows by itself: hsmon's manifest is an extraction's, a
    regeneration's its own; None for another tool's layout (SpecForge, speculators) or none."""
    return {"hsmon": "extract", "regenerate": "regenerate"}.get(out.layout) if out is not None else None


class JobRuntime:
    """One job: its trackers, its activity clocks and its current state."""

    def __init__(self, cfg: JobConfig, now: float) -> None:
        self.cfg = cfg
        self.watch_start_ts = now
        self.dump = DumpDirTracker(cfg.dump_dir) if cfg.dump_dir else None
        self.output = OutputDirTracker(cfg.out_dir) if cfg.out_dir else None
        self.verify = VerifyWatch(cfg.verify, cfg.out_dir) if cfg.verify and cfg.out_dir else None
        self.progress = ProgressTracker(cfg.events, start=cfg.events_from) if cfg.events else None
        self.processes = [ProcessTracker(spec) for spec in cfg.process_specs()]
        self._pid_from_events = not self.processes
        self.servers = [ServerTracker(spec, now) for spec in cfg.servers]
        self._event_urls: list[str] = []
        self._said_missing: set[str] = set()  # missing watched paths already logged
        self.gpu: Any = None  # the Monitor's GpuTracker (shared by its jobs)
        self.errors = TrackerErrors()  # the Monitor's (shared by its jobs)
        self.procs: list[ProcessEntry] = []  # the processes' last sections (kept if a poll fails)
        shm = (cfg.dump_dir if cfg.dump_dir.startswith("/dev/shm") else cfg.shm_dir) if cfg.dump_dir else None
        self.disk = disk.DiskTracker(cfg.out_dir, shm, cfg.needed_bytes) if cfg.out_dir or shm else None
        self.plan = TickPlan()
        self.tick = TickFigures()  # this tick's sections, for the trackers that read them
        made = (make(self) for make in job_trackers.JOB_TRACKERS)  # the job's trackers, from the list
        self.trackers: list[Tracker] = [t for t in made if t is not None]
        self._sections: dict[str, Any] = {}  # each tracker's last section (kept if one fails)
        self._gpu_pids: dict[int, tuple[float, set[int]]] = {}  # watched pid -> (when, descendants)
        self.machine = JobState(now)  # where its state machine stands
        self.activity = ActivityClocks()
        self._out_rows_rate = RateWindow(60.0)
        self.ending = EndingWatch()
        self._runner_alive = False
        self.watch: Any = None
        self.watch_inode: int | None = None
        self.doc: JobStatus | None = None  # None until the first tick measured the job
        self.measured_ts: float | None = None  # when a tick last published ``doc``
        self.decision: Decision | None = None

    # -- measuring ----------------------------------------------------------------------------
    def poll_processes(self) -> list[dict[str, Any]]:
        if self._pid_from_events and self.progress is not None and self.progress.pid:
            if not self.processes:
                self.processes.append(
                    ProcessTracker(ProcessSpec(self._events_role(), pid=self.progress.pid))
                )
            elif self.processes[0].spec.pid != self.progress.pid:
                self.processes[0].set_pid(self.progress.pid)
        return [p.poll() for p in self.processes]

    def _events_role(self) -> str:
        """The role of the process the start event names: a regeneration's is the regenerator."""
        if not self.cfg.role and self.progress is not None and self.progress.started_as == "regenerate":
            return "regenerator"
        return self.cfg.default_role

    def adopt_dump_dir(self) -> None:
        """Without a configured dump directory, watch the one the start event names (`hsmon extract
        --backend sglang`'s), as the servers its URLs name: a daemon given only --out and --events
        (README's production commands) watches the whole job."""
        path = self.progress.dump_dir if self.progress is not None else None
        if self.cfg.dump_dir or self.dump is not None or not path:
            return
        self.dump = DumpDirTracker(path)
        shm = path if path.startswith("/dev/shm") else self.cfg.shm_dir
        self.disk = disk.DiskTracker(self.cfg.out_dir, shm, self.cfg.needed_bytes)
        names = [t.name for t in self.trackers]
        at = names.index("output_dir") if "output_dir" in names else len(names)
        self.trackers.insert(at, job_trackers.DumpDirJob(self))  # where the list puts it
        if "disk" not in names:
            self.trackers.append(job_trackers.DiskJob(self))

    def poll_servers(self, now: float) -> None:
        """Start the server trackers; without configured servers, follow the start event's URLs."""
        if not self.cfg.servers and self.progress is not None:
            urls = self.progress.server_urls
            if urls != self._event_urls:
                self._event_urls = urls
                specs = []
                for url in dict.fromkeys(urls):
                    try:
                        specs.append(self.cfg.server_spec(url))
                    except ConfigError:
                        log.warning("job %s: bad server URL %r in its start event", self.cfg.name, url)
                for tracker in self.servers:
                    tracker.stop()
                self.servers = [ServerTracker(spec, now) for spec in specs]
        for tracker in self.servers:
            if not tracker.started:
                tracker.start()
        if len(self.servers) == 1 and self.progress is not None:
            # the job's rows arrive from its one server: a sign of forward progress there
            self.servers[0].note_job_progress(self.progress.last_progress_ts)

    def close(self) -> None:
        """Stop the server trackers' threads, a manifest read and an engine check in progress."""
        for tracker in self.servers:
            tracker.stop()
        if self.output is not None:
            self.output.close()
        if self.verify is not None:
            self.verify.close()

    def _gpu_facts(self, procs: list[ProcessEntry]) -> tuple[list[int], float | None]:
        """The GPUs the job's processes (or their children) hold memory on, and since when all idle."""
        from hsmon.core.trackers.gpu import job_gpus

        if self.gpu is None or not self.gpu.devices:
            return [], None
        return job_gpus(self.gpu.devices, procs, self._gpu_pids)

    def _note_activity(
        self, now: float, procs: list[ProcessEntry], dump: DumpSection | None, out: OutputSection | None
    ) -> None:
        files = (self.dump and self.dump.newest_mtime, self.output and self.output.newest_mtime)
        self.activity.note(now, procs, dump, out, [t for t in files if t],
                           self.dump.last_change_ts if self.dump is not None else None)
        if self._regenerates(out):  # its work is the answers its servers decode between its rows
            decoded = [t.decode_moved_ts for t in self.servers if t.decode_moved_ts is not None]
            self.activity.note_engine(max(decoded) if decoded else None)

    def _regenerates(self, out: OutputSection | None) -> bool:
        started = self.progress.started_as if self.progress is not None else None
        return self.cfg.kind == "regenerate" or (started or _kind_of_output(out)) == "regenerate"

    @property
    def last_work_ts(self) -> float | None:
        """When dump files or the output last moved (None: never seen)."""
        return self.activity.last_work_ts

    @property
    def last_busy_ts(self) -> float | None:
        """When a process's CPU or I/O was last above idle (None: never seen)."""
        return self.activity.last_busy_ts

    def dump_dir_changed(self) -> bool:
        """The dump directory appeared, vanished or was replaced since the last scan (one stat)."""
        assert self.dump is not None
        try:
            inode = os.stat(self.dump.path).st_ino
        except OSError:
            return self.dump.exists
        return not self.dump.exists or inode != self.dump.dir_inode

    def update(self, now: float, scan_dump: bool, scan_output: bool, full_scan: bool = True,
               background: bool = False) -> str | None:
        """Poll everything due, decide the state, move to it, and publish the job's status built
        from the trackers' sections and the decision. Returns the previous state when it changed
        ("none" for the first), else None. With ``background``, a large manifest is read on a
        thread: until it is read the job's status says so and nothing is decided (the figures are
        not known yet)."""
        guard, job = self.errors.guard, self.cfg.name
        self.plan = TickPlan(scan_dump, scan_output, full_scan, background)
        guard("dump_dir", self.adopt_dump_dir, None, job)  # before the trackers are polled
        poll_all(self.trackers, self.errors, job, now)
        procs = self.procs
        gone = bool(procs) and not (procs[0].alive and procs[0].status != "zombie")
        self._runner_alive = gone and self.ending.runner_alive(self.progress)
        if gone and self.progress is not None:
            # read again after the process (and hsmon run) checks: an ending written before they
            # exited is seen now, so a clean exit never reads as dead for one tick
            guard("progress", self.progress.poll, None, job)
        if self.output is not None and self.output.reading is not None:
            self._publish_reading(now)
            return None
        first = [t for t in self.trackers if not getattr(t, "reads_sections", False)]
        sec = sections(first, self.errors, job, now, self._sections)
        dump: DumpSection | None = sec.get("dump_dir")
        out: OutputSection | None = sec.get("output_dir")
        out = guard("verify", lambda: self._poll_verify(now, out), out, job)
        self._note_activity(now, procs, dump, out)
        prog: ProgressSections | None = sec.get("progress")

        rows_total = (
            (prog and prog.progress.rows_total)
            or self.cfg.rows_total
            or (self.output.rows_total_hint if self.output else None)
        )
        if out is not None:
            self._out_rows_rate.add(now, out.rows or 0)
        progress = merge_output_progress(
            prog.progress if prog else None, out, rows_total, self._out_rows_rate.rate()
        )
        self.tick = TickFigures(dump, out, rows_total, progress)
        after = [t for t in self.trackers if t not in first]
        sec.update(sections(after, self.errors, job, now, self._sections))
        disks: list[DiskEntry] = sec.get("disk") or []
        snap = self._snapshot(now, procs, dump, out, disks)
        snap.rows_total = rows_total
        snap.rows_done = max(progress.rows_done or 0, (out.rows if out else None) or 0) if progress else None
        snap.online = sec.get("online")
        blind = self.errors.blind(job)
        self.decision = blind_decision(decide(snap), blind)

        if prog and out and out.layout == "hsmon" and progress.bytes_per_s is None:
            progress.bytes_per_s = self.disk.out_bytes_rate.rate() if self.disk else None
        previous = self.machine.move_to(self.decision, now, self.cfg.name)
        parts = Sections(
            progress=slower_eta(progress, self.decision.online),
            dump=dump,
            output=out,
            disk=disks,
            processes=both_sides(procs, sec.get("online")),
            events=prog.events if prog else None,
            recent_events=prog.recent_events if prog else [],
            training=prog.training if prog else None,
            servers=sec.get("server") or [],
            gpu_indices=snap.gpu_indices,
            gpu_idle_since_ts=snap.gpu_idle_since_ts,
            last_work_ts=self.last_work_ts,
            last_busy_ts=self.last_busy_ts,
            started_as=(prog.started_as if prog else None) or _kind_of_output(out),
            online=self.decision.online,
            regenerate=sec.get("regenerate"),
            logs=job_logs(self.progress.log_path if self.progress else None, self.processes),
        )
        self.doc = job_status(self.cfg, self.machine, parts)  # published whole
        if blind:
            self.doc = replace(self.doc, blind=blind_entries(blind))
        self.measured_ts = now
        return previous

    def status(self, now: float, stale_after: float | None = None) -> JobStatus:
        """The job's status with its dump directory and servers read now (a hung server shows at
        the next request, not the next tick); ``unknown`` when no tick has measured it for
        ``stale_after`` seconds (a tracker call that never returns; None: a reader that ticks itself)."""
        doc = self.doc if self.doc is not None else not_measured(self.cfg, self.watch_start_ts)
        dump = self.dump.snapshot(now) if self.dump is not None else None
        servers = [t.snapshot(now) for t in self.servers] if self.servers else None
        live = with_live(doc, dump, servers)
        if stale_after is None:
            return live
        measured = self.measured_ts if self.measured_ts is not None else self.watch_start_ts
        return stale_status(live, now, measured, stale_after, self.errors.in_call(self.cfg.name))

    def _snapshot(
        self,
        now: float,
        procs: list[ProcessEntry],
        dump: DumpSection | None,
        out: OutputSection | None,
        disks: list[DiskEntry],
    ) -> Snapshot:
        """The plain facts ``decide`` needs, gathered from the trackers."""
        facts = [
            ProcessFacts(
                role=p.role,
                pid=p.pid,
                alive=p.alive,
                status=p.status,
                seen_alive=t.seen_alive,
                stdout=p.stdout,
                stdout_buffered=p.stdout_buffered,
                cmdline=p.cmdline,
                oom_kill=p.oom_kill,
                oom_in_cgroup=t.oom_hint(),
            )
            for p, t in zip(procs, self.processes, strict=False)
        ]
        started_procs = [p.start_ts for p in procs if p.start_ts]
        watch_ref = min([self.watch_start_ts, *started_procs])
        out_disk = next((d for d in disks if d.role == "output"), None)
        shm_disk = next((d for d in disks if d.role == "shm"), None)
        pr = self.progress
        exit_log, exit_tail = self.ending.log_tail(procs, self.processes[0] if self.processes else None, pr)
        gpu_indices, gpu_idle = self._gpu_facts(procs)
        return Snapshot(
            runner_alive=self._runner_alive,
            exit_log=exit_log,
            exit_log_tail=exit_tail,
            now=now,
            stall_after=self.cfg.stall_after,
            watch_start_ts=watch_ref,
            processes=facts,
            process_watched=bool(self.processes),
            events_watched=pr is not None,
            started=bool(pr and pr.started),
            terminal_kind=pr.terminal_kind if pr else None,
            terminal_ts=pr.terminal_ts if pr else None,
            stopped=StopFacts.of_event(pr.terminal_event) if pr else None,
            done=DoneFacts.of_event(pr.terminal_event) if pr else None,
            paused_reason=pr.paused_reason if pr else None,
            last_progress_ts=pr.last_progress_ts if pr else None,
            last_error=pr.last_error if pr else None,
            last_work_ts=self.last_work_ts,
            work_what=self.activity.last_work_what,
            last_busy_ts=self.last_busy_ts,
            evidence_of_job=bool(
                (pr and pr.last_event_ts) or (out and out.rows) or (dump and dump.files)
            ),
            bad_event_lines=pr.reader.bad_lines if pr else 0,
            disk_fits=out_disk.fits if out_disk else None,
            disk_message=disk.shortfall_message(out_disk),
            shm_fits=shm_disk.fits if shm_disk else None,
            shm_message=disk.shortfall_message(shm_disk),
            dump_oldest_age_s=dump.oldest_age_s if dump else None,
            missing_paths=self._missing_paths(out, pr),
            servers=[t.facts(now) for t in self.servers],
            gpu_indices=gpu_indices,
            gpu_idle_since_ts=gpu_idle,
            events_start_ts=pr.start_ts if pr else None,
            output_ending=out.ending if out else None,
            output_ending_ts=out.ending_ts if out else None,
            output_run_seconds=out.run_seconds if out else None,
            data=self.output.data_summary() if out and out.layout == "hsmon" else None,
            verify=self.verify.result if self.verify is not None else None,
        )

    def _missing_paths(self, out: OutputSection | None,
                       pr: ProgressTracker | None) -> list[tuple[str, str]]:
        """Watched paths that do not exist (the output directory; an events file whose directory is
        missing too), each logged once while missing."""
        missing = []
        if out is not None and not out.exists:
            missing.append(("--out", out.path))
        if pr is not None and not pr.exists and not os.path.isdir(os.path.dirname(os.path.abspath(pr.path))):
            missing.append(("--events", pr.path))
        for flag, path in missing:
            if path not in self._said_missing:
                log.warning("job %s: %s %s does not exist: nothing there to watch until a job creates it",
                            self.cfg.name, flag, path)
        self._said_missing = {path for _, path in missing}
        return missing

    def _poll_verify(self, now: float, out: OutputSection | None) -> OutputSection | None:
        """Run the engine check when its chunks are due; ``out`` with its section in ``output.data``."""
        if self.verify is None or out is None or out.layout != "hsmon":
            return out
        data = out.data if out.data is not UNSET else None
        self.verify.poll(out.chunks_complete, data.newest_chunk if data else None, now)
        if data is None:
            return out
        return replace(out, data=replace(data, verify=self.verify.result.section()))

    def _publish_reading(self, now: float) -> None:
        """The job's status while its output's manifest is read: the state it had (starting at
        first), the reading's progress as the reason, the output section saying how far."""
        from hsmon.contracts.units import format_bytes

        assert self.output is not None
        out = self.output.snapshot()
        done, total = (out.reading.bytes_done, out.reading.bytes_total) if out.reading else (0, 0)
        pct = f" ({100.0 * done / total:.0f} %)" if total else ""
        self.decision = None
        base = self.doc if self.doc is not None else not_measured(self.cfg, self.machine.since_ts)
        self.doc = replace(
            base,
            state=self.machine.state or "starting",
            state_since_ts=self.machine.since_ts,
            reason=f"reading the manifest of {self.output.path}: {format_bytes(done)} of "
                   f"{format_bytes(total)}{pct}",
            output=out,
        )
        self.measured_ts = now

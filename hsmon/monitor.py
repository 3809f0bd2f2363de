"""The Monitor: owns the trackers of several jobs, runs them, and answers the status document.

Threads live here (edges): a watchdog observer feeds the dump-directory trackers for latency, and
one tick thread polls processes and events, runs the reconciliation scans (periodic, and at once
when watchdog logs an inotify queue overflow), and decides each job's state with hsmon.state.
``status_document()`` and the exporter read memory only: they never list a directory.

Stable API (the TUI uses it in-process):
    Monitor(jobs=None, *, scan_interval=2.0, tick_interval=1.0, use_watchdog=True, source="daemon")
    add_job(JobConfig), remove_job(name), job_names(), start(), stop(), tick(),
    status_document() -> dict, job_pid(name) -> int | None
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from hsmon import __version__
from hsmon import events as ev
from hsmon.config import DEFAULT_SCAN_INTERVAL, JobConfig, ProcessSpec
from hsmon.state import Decision, ProcessFacts, Snapshot, decide
from hsmon.trackers import disk
from hsmon.trackers.dump_dir import DumpDirTracker
from hsmon.trackers.output_dir import OutputDirTracker
from hsmon.trackers.processes import ProcessTracker
from hsmon.trackers.progress import ProgressTracker
from hsmon.trackers.rates import RateWindow

log = logging.getLogger("hsmon.monitor")

# Below these a process counts as idle (a heartbeat thread, a log line now and then).
BUSY_CPU_FRACTION = 0.02
BUSY_IO_BYTES_PER_S = 16 * 1024
STATUS_VERSION = 1
FULL_SCAN_EVERY = 10

TransitionListener = Callable[[dict[str, Any], "str | None"], None]


class _OverflowHandler(logging.Handler):
    """watchdog 7.1 only logs an inotify queue overflow: turn that log record into a scan."""

    def __init__(self, on_overflow: Callable[[], None]) -> None:
        super().__init__(logging.WARNING)
        self._on_overflow = on_overflow

    def emit(self, record: logging.LogRecord) -> None:
        if "overflow" in record.getMessage().lower():
            self._on_overflow()


class JobRuntime:
    """One job: its trackers, its activity clocks and its current state."""

    def __init__(self, cfg: JobConfig, now: float) -> None:
        self.cfg = cfg
        self.watch_start_ts = now
        self.dump = DumpDirTracker(cfg.dump_dir) if cfg.dump_dir else None
        self.output = OutputDirTracker(cfg.out_dir) if cfg.out_dir else None
        self.progress = ProgressTracker(cfg.events) if cfg.events else None
        self.processes = [ProcessTracker(spec) for spec in cfg.process_specs()]
        self._pid_from_events = not self.processes
        self.state: str | None = None
        self.state_since_ts = now
        self.reason = ""
        self.transitions_total = 0
        self.transitions_by_state: dict[str, int] = {}
        self.state_events: deque[dict[str, Any]] = deque(maxlen=20)
        self.last_work_ts: float | None = None
        self.last_busy_ts: float | None = None
        self._work_marks: tuple[Any, ...] | None = None
        self._last_look_ts: float | None = None
        self._busy_marks: dict[int, tuple[float, float, float]] = {}  # pid -> (mono, cpu, io)
        self._out_bytes_rate = RateWindow(60.0)
        self._shm_bytes_rate = RateWindow(30.0)
        self.watch: Any = None
        self.watch_inode: int | None = None
        self.doc: dict[str, Any] = {}
        self._next_doc: dict[str, Any] = {}
        self.decision: Decision | None = None

    # -- measuring ----------------------------------------------------------------------------
    def poll_processes(self) -> list[dict[str, Any]]:
        if self._pid_from_events and self.progress is not None and self.progress.pid:
            if not self.processes:
                self.processes.append(
                    ProcessTracker(ProcessSpec(self.cfg.default_role, pid=self.progress.pid))
                )
            elif self.processes[0].spec.pid != self.progress.pid:
                self.processes[0].set_pid(self.progress.pid)
        return [p.poll() for p in self.processes]

    def _note_activity(
        self, now: float, procs: list[dict[str, Any]], dump: dict[str, Any] | None, out: dict[str, Any] | None
    ) -> None:
        marks = (
            dump and (dump["created_total"], dump["consumed_total"]),
            out and (out["rows"], out["bytes"], out["temp_files"], out["chunks_complete"]),
        )
        if self._work_marks is None:
            # first look: the files' own times say when work last happened before we watched
            times = [
                t
                for t in (self.dump and self.dump.newest_mtime, self.output and self.output.newest_mtime)
                if t
            ]
            self.last_work_ts = min(max(times), now) if times else None
        elif marks != self._work_marks:
            # it moved somewhere since the previous look: credit that look's time (as for CPU)
            since = self._last_look_ts if self._last_look_ts is not None else now
            self.last_work_ts = max(self.last_work_ts or 0.0, since)
        self._work_marks = marks
        self._last_look_ts = now
        change = self.dump.last_change_ts if self.dump is not None else None
        if change is not None and (self.last_work_ts is None or change > self.last_work_ts):
            self.last_work_ts = change  # an event's time: finer than the tick
        mono = time.monotonic()
        for proc in procs:
            if not proc["alive"] or proc["pid"] is None or proc["cpu_seconds"] is None:
                continue
            io = float((proc.get("read_chars") or 0) + (proc.get("write_chars") or 0))
            prev = self._busy_marks.get(proc["pid"])
            self._busy_marks[proc["pid"]] = (mono, proc["cpu_seconds"], io)
            if prev is None:
                # first sight: no rate yet. A process that has been busy on average over its life
                # counts as busy now (conservative: never a stall alarm before a second sample)
                uptime = proc.get("uptime_s") or 0.0
                if uptime > 0 and proc["cpu_seconds"] / uptime > BUSY_CPU_FRACTION:
                    self.last_busy_ts = max(self.last_busy_ts or 0.0, now)
                continue
            if mono <= prev[0]:
                continue
            dt = mono - prev[0]
            if (proc["cpu_seconds"] - prev[1]) / dt > BUSY_CPU_FRACTION or (
                io - prev[2]
            ) / dt > BUSY_IO_BYTES_PER_S:
                # the work happened somewhere since the previous sample: credit it to that sample's
                # time, so that a process frozen just now does not look busy for one more tick
                self.last_busy_ts = max(self.last_busy_ts or 0.0, now - dt)

    def _dump_dir_changed(self) -> bool:
        """The dump directory appeared, vanished or was replaced since the last scan (one stat)."""
        assert self.dump is not None
        try:
            inode = os.stat(self.dump.path).st_ino
        except OSError:
            return self.dump.exists
        return not self.dump.exists or inode != self.dump.dir_inode

    def update(self, now: float, scan_dump: bool, scan_output: bool, full_scan: bool = True) -> None:
        """Poll everything due, decide the state, and rebuild the cached document."""
        if self.progress is not None:
            self.progress.poll()
        procs = self.poll_processes()
        if self.dump is not None and (scan_dump or self._dump_dir_changed()):
            self.dump.scan(full=full_scan)
        if self.output is not None and scan_output:
            self.output.scan()
        if self.dump is not None:
            self.dump.sample_rates(now)
        dump = self.dump.snapshot(now) if self.dump else None
        out = self.output.snapshot() if self.output else None
        self._note_activity(now, procs, dump, out)
        prog = self.progress.snapshot(now) if self.progress else None

        rows_total = (
            (prog and prog["progress"]["rows_total"])
            or self.cfg.rows_total
            or (self.output.rows_total_hint if self.output else None)
        )
        eta = prog["progress"]["eta_s"] if prog else None
        disks = []
        if out is not None:
            self._out_bytes_rate.add(now, out["bytes"] or 0)
            needed = disk.needed_bytes(out["bytes"], out["rows"], rows_total, self.cfg.needed_bytes)
            disks.append(
                disk.headroom(
                    "output",
                    self.cfg.out_dir,
                    disk.usage(self.cfg.out_dir),
                    needed,
                    self._out_bytes_rate.rate(),
                    eta,
                )
            )
        if self.dump is not None:
            shm_path = self.cfg.dump_dir if self.cfg.dump_dir.startswith("/dev/shm") else self.cfg.shm_dir
            self._shm_bytes_rate.add(now, max(0, dump["bytes"]))
            rate = self._shm_bytes_rate.rate()
            disks.append(
                disk.headroom(
                    "shm", shm_path, disk.usage(shm_path), None, rate if rate and rate > 0 else None, eta
                )
            )

        facts = [
            ProcessFacts(
                role=p["role"],
                pid=p["pid"],
                alive=p["alive"],
                status=p["status"],
                seen_alive=t.seen_alive,
                stdout=p["stdout"],
                stdout_buffered=p["stdout_buffered"],
                cmdline=p["cmdline"],
            )
            for p, t in zip(procs, self.processes, strict=False)
        ]
        started_procs = [p["start_ts"] for p in procs if p["start_ts"]]
        watch_ref = min([self.watch_start_ts, *started_procs])
        out_disk = next((d for d in disks if d["role"] == "output"), None)
        shm_disk = next((d for d in disks if d["role"] == "shm"), None)
        pr = self.progress
        snap = Snapshot(
            now=now,
            stall_after=self.cfg.stall_after,
            watch_start_ts=watch_ref,
            processes=facts,
            process_watched=bool(self.processes),
            events_watched=pr is not None,
            started=bool(pr and pr.started),
            terminal_kind=pr.terminal_kind if pr else None,
            terminal_ts=pr.terminal_ts if pr else None,
            paused_reason=pr.paused_reason if pr else None,
            last_progress_ts=pr.last_progress_ts if pr else None,
            last_error=pr.last_error if pr else None,
            last_work_ts=self.last_work_ts,
            last_busy_ts=self.last_busy_ts,
            evidence_of_job=bool(
                (pr and pr.last_event_ts) or (out and out["rows"]) or (dump and dump["files"])
            ),
            bad_event_lines=pr.reader.bad_lines if pr else 0,
            disk_fits=out_disk["fits"] if out_disk else None,
            disk_message=_disk_message(out_disk),
            shm_fits=shm_disk["fits"] if shm_disk else None,
            shm_message=_disk_message(shm_disk),
            dump_oldest_age_s=dump["oldest_age_s"] if dump else None,
        )
        self.decision = decide(snap)

        progress = prog["progress"] if prog else _progress_from_output(out, rows_total)
        if prog and out and out.get("layout") == "hsmon":
            progress.setdefault("bytes_per_s", None)
            if progress["bytes_per_s"] is None:
                progress["bytes_per_s"] = self._out_bytes_rate.rate()
        self._next_doc = {
            "job": self.cfg.name,
            "kind": self.cfg.kind,
            "state": self.state or self.decision.state,
            "state_since_ts": self.state_since_ts,
            "reason": self.decision.reason,
            "hints": [h.as_dict() for h in self.decision.hints],
            "transitions_total": self.transitions_total,
            "state_history": list(self.state_events),
            "stall_after_s": self.cfg.stall_after,
            "last_work_ts": self.last_work_ts,
            "last_busy_ts": self.last_busy_ts,
            "progress": progress,
            "dump": dump,
            "output": out,
            "disk": disks,
            "processes": procs,
            "events": prog["events"] if prog else None,
            "recent_events": sorted(
                (prog["recent_events"] if prog else []) + list(self.state_events),
                key=lambda e: e.get("ts") or 0,
            )[-20:],
            "training": prog["training"] if prog else None,
        }

    def apply_decision(self, now: float) -> str | None:
        """Move to the decided state; returns the previous state when it changed."""
        assert self.decision is not None
        new = self.decision.state
        self.reason = self.decision.reason
        doc = self._next_doc
        if new == self.state:
            doc.update(state=new, state_since_ts=self.state_since_ts)
            self.doc = doc  # published whole: readers never see a half-built document
            return None
        previous, self.state, self.state_since_ts = self.state, new, now
        self.transitions_total += 1
        self.transitions_by_state[new] = self.transitions_by_state.get(new, 0) + 1
        event = ev.make_event(
            ev.STATE, self.cfg.name, ts=now, state=new, previous=previous, reason=self.decision.reason
        )
        self.state_events.append(event)
        doc.update(
            state=new,
            state_since_ts=now,
            transitions_total=self.transitions_total,
            state_history=list(self.state_events),
            recent_events=sorted(doc["recent_events"] + [event], key=lambda e: e.get("ts") or 0)[-20:],
        )
        self.doc = doc
        return previous or "none"


def _disk_message(entry: dict[str, Any] | None) -> str | None:
    if not entry:
        return None
    from hsmon.units import format_bytes, format_duration

    if entry["needed_bytes"] is not None and entry["free_bytes"] is not None:
        return (
            f"{entry['role']} filesystem of {entry['path']}: needs ~{format_bytes(entry['needed_bytes'])}, "
            f"{format_bytes(entry['free_bytes'])} free: free space before it fills"
        )
    return (
        f"{entry['role']} filesystem of {entry['path']} fills in {format_duration(entry['time_to_full_s'])}, "
        f"before the job is done (in {format_duration(entry['time_to_done_s'])})"
    )


def _progress_from_output(out: dict[str, Any] | None, rows_total: int | None) -> dict[str, Any] | None:
    """Without events, the output directory is the progress we can see."""
    if out is None:
        return None
    return {
        "rows_done": out["rows"],
        "rows_total": rows_total,
        "tokens_done": out["tokens"],
        "tokens_total": None,
        "chunks_done": out["chunks_complete"],
        "chunks_total": None,
        "rejects": out.get("rejects"),
        "rows_per_s": None,
        "tokens_per_s": None,
        "bytes_per_s": None,
        "elapsed_s": None,
        "eta_s": None,
        "last_progress_ts": None,
    }


class Monitor:
    """Watches several jobs. Thread-safe; ``status_document()`` never touches the filesystem."""

    def __init__(
        self,
        jobs: list[JobConfig] | None = None,
        *,
        scan_interval: float = DEFAULT_SCAN_INTERVAL,
        tick_interval: float = 1.0,
        use_watchdog: bool = True,
        source: str = "daemon",
        event_log: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.scan_interval = scan_interval
        self.tick_interval = min(tick_interval, scan_interval)
        self.use_watchdog = use_watchdog
        self.source = source
        self.started_ts = time.time()
        self.event_log = event_log
        self._lock = threading.RLock()
        self._tick_lock = threading.Lock()
        self._jobs: dict[str, JobRuntime] = {}
        self._listeners: list[TransitionListener] = []
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._scan_requested = threading.Event()
        self._thread: threading.Thread | None = None
        self._observer: Any = None
        self._overflow_handler: _OverflowHandler | None = None
        self._last_scan_mono = 0.0
        self.overflows_total = 0
        self.scans_total = 0
        self.ticks_total = 0
        self.tick_seconds_last = 0.0
        for cfg in jobs or []:
            self.add_job(cfg)

    # -- jobs ---------------------------------------------------------------------------------
    def add_job(self, cfg: JobConfig) -> None:
        """Watch one more job (allowed while running). Raises ValueError on a duplicate name."""
        with self._lock:
            if cfg.name in self._jobs:
                raise ValueError(f"a job named {cfg.name!r} is already watched; pick another name")
            runtime = JobRuntime(cfg, time.time())
            self._jobs[cfg.name] = runtime
        if self._thread is not None:
            self._wake.set()

    def remove_job(self, name: str) -> bool:
        with self._lock:
            runtime = self._jobs.pop(name, None)
        if runtime is not None and runtime.watch is not None and self._observer is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._observer.unschedule(runtime.watch)
        return runtime is not None

    def job_names(self) -> list[str]:
        with self._lock:
            return list(self._jobs)

    def job_config(self, name: str) -> JobConfig | None:
        with self._lock:
            runtime = self._jobs.get(name)
        return runtime.cfg if runtime else None

    def job_pid(self, name: str) -> int | None:
        """PID of the job's main process, if one is alive."""
        with self._lock:
            runtime = self._jobs.get(name)
        if runtime is None:
            return None
        for proc in runtime.doc.get("processes") or []:
            if proc.get("alive"):
                return proc.get("pid")
        return None

    def add_listener(self, listener: TransitionListener) -> None:
        """``listener(job_doc, previous_state)`` after every tick for every job; previous_state is
        not None only when the state just changed."""
        self._listeners.append(listener)

    # -- running ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the observer and the tick thread (one tick runs before this returns)."""
        if self._thread is not None:
            return
        if self.use_watchdog:
            from watchdog.observers import Observer

            self._observer = Observer()
            self._observer.daemon = True
            self._observer.start()
            self._overflow_handler = _OverflowHandler(self.request_scan)
            wd_log = logging.getLogger("watchdog.observers")
            if wd_log.level == logging.NOTSET or wd_log.level > logging.WARNING:
                wd_log.setLevel(logging.WARNING)
            wd_log.addHandler(self._overflow_handler)
        self.tick(force_scan=True)
        self._thread = threading.Thread(target=self._run, name="hsmon-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None
        if self._overflow_handler is not None:
            logging.getLogger("watchdog.observers").removeHandler(self._overflow_handler)
            self._overflow_handler = None

    def request_scan(self) -> None:
        """Reconcile every dump directory now (called on inotify queue overflow)."""
        self.overflows_total += 1
        self._scan_requested.set()
        self._wake.set()

    def _run(self) -> None:
        next_tick = time.monotonic() + self.tick_interval
        while not self._stop.is_set():
            self._wake.wait(timeout=max(0.0, next_tick - time.monotonic()))
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.tick()
            except Exception:  # a bug in one tick must not end the watch
                log.exception("monitor tick failed")
            next_tick = time.monotonic() + self.tick_interval

    def tick(self, force_scan: bool = False) -> None:
        """One pass over every job (the tick thread calls this; one-shot readers may too)."""
        with self._tick_lock:
            started = time.perf_counter()
            mono = time.monotonic()
            overflow = self._scan_requested.is_set()
            scan = force_scan or overflow or mono - self._last_scan_mono >= self.scan_interval - 1e-3
            if scan:
                self._scan_requested.clear()
                self._last_scan_mono = mono
                self.scans_total += 1
            with self._lock:
                runtimes = list(self._jobs.values())
            for runtime in runtimes:
                now = time.time()
                # a full listing on overflow and every FULL_SCAN_EVERY scans; between them a scan
                # lists only a directory whose mtime moved
                full = force_scan or overflow or self.scans_total % FULL_SCAN_EVERY == 0
                runtime.update(now, scan_dump=scan, scan_output=scan, full_scan=full)
                if self._observer is not None and runtime.dump is not None:
                    self._ensure_watch(runtime)
                previous = runtime.apply_decision(now)
                if previous is not None:
                    self._log_transition(runtime, previous)
                for listener in self._listeners:
                    try:
                        listener(runtime.doc, previous)
                    except Exception:
                        log.exception("state listener failed")
            self.ticks_total += 1
            self.tick_seconds_last = time.perf_counter() - started

    def _log_transition(self, runtime: JobRuntime, previous: str) -> None:
        event = runtime.state_events[-1]
        log.info(
            "job %s: %s -> %s (%s)",
            runtime.cfg.name,
            previous,
            runtime.state,
            runtime.reason or event.get("reason"),
        )
        if self.event_log is not None:
            try:
                self.event_log(event)
            except (OSError, ValueError):
                log.exception("cannot write the state event")

    def _ensure_watch(self, runtime: JobRuntime) -> None:
        """(Re)schedule the inotify watch when the dump directory appears or is recreated."""
        tracker = runtime.dump
        assert tracker is not None
        if not tracker.exists or tracker.error:
            if runtime.watch is not None:
                self._unschedule(runtime)
            return
        if runtime.watch is not None and runtime.watch_inode == tracker.dir_inode:
            return
        self._unschedule(runtime)
        from hsmon.watch import DumpDirHandler

        try:
            runtime.watch = self._observer.schedule(
                DumpDirHandler(tracker),
                tracker.path,
                recursive=False,
                event_filter=DumpDirHandler.EVENT_TYPES,
            )
            runtime.watch_inode = tracker.dir_inode
        except OSError as exc:
            log.warning("cannot watch %s: %s (scans still run)", tracker.path, exc)
            runtime.watch = None
            return
        tracker.scan()  # files created before the watch existed

    def _unschedule(self, runtime: JobRuntime) -> None:
        if runtime.watch is None:
            return
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._observer.unschedule(runtime.watch)
        runtime.watch = None
        runtime.watch_inode = None

    # -- reading ------------------------------------------------------------------------------
    def job_documents(self) -> list[dict[str, Any]]:
        """The jobs' sections, dump figures live from memory."""
        now = time.time()
        with self._lock:
            runtimes = list(self._jobs.values())
        docs = []
        for runtime in runtimes:
            doc = (
                dict(runtime.doc)
                if runtime.doc
                else {
                    "job": runtime.cfg.name,
                    "kind": runtime.cfg.kind,
                    "state": "starting",
                    "reason": "not measured yet",
                    "hints": [],
                }
            )
            if runtime.dump is not None:
                doc["dump"] = runtime.dump.snapshot(now)
            docs.append(doc)
        return docs

    def status_document(self) -> dict[str, Any]:
        """The status document of docs/status-api.md."""
        return {
            "v": STATUS_VERSION,
            "generated_ts": time.time(),
            "daemon": {
                "version": __version__,
                "pid": os.getpid(),
                "started_ts": self.started_ts,
                "source": self.source,
                "scans_total": self.scans_total,
                "overflows_total": self.overflows_total,
                "ticks_total": self.ticks_total,
                "tick_seconds_last": self.tick_seconds_last,
            },
            "jobs": self.job_documents(),
        }

    def transitions(self) -> dict[str, dict[str, int]]:
        """job -> state -> transitions into that state (for the exporter)."""
        with self._lock:
            return {name: dict(rt.transitions_by_state) for name, rt in self._jobs.items()}

    def dump_counters(self) -> dict[str, dict[str, float]]:
        """job -> dump tracker internals (events, scans, last scan seconds) for the exporter."""
        with self._lock:
            runtimes = list(self._jobs.items())
        return {
            name: {
                "events_total": rt.dump.events_total,
                "scans_total": rt.dump.scans_total,
                "scan_seconds_last": rt.dump.scan_seconds_last,
            }
            for name, rt in runtimes
            if rt.dump is not None
        }

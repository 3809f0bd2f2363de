"""The Monitor: owns the trackers of several jobs, runs them, and answers the status document.

Threads live here (edges): a watchdog observer feeds the dump-directory trackers for latency, and
one tick thread polls processes and events, runs the reconciliation scans (periodic, and at once
when watchdog logs an inotify queue overflow), and decides each job's state with hsmon.core.state.
``status_document()`` and the exporter read memory only: they never list a directory.

Stable API (the TUI uses it in-process):
    Monitor(jobs=None, *, scan_interval=2.0, tick_interval=1.0, use_watchdog=True, source="daemon")
    add_job(JobConfig), remove_job(name), job_names(), start(), stop(), tick(), add_tick_listener(fn),
    status() -> StatusDocument (hsmon.status_doc), status_document() -> dict (its JSON form),
    job_pid(name) -> int | None
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

from hsmon import __version__
from hsmon.core.config import DEFAULT_SCAN_INTERVAL, JobConfig
from hsmon.core.job_runtime import JobRuntime
from hsmon.core.state_blind import STALE_AFTER_S
from hsmon.core.tracker_errors import TrackerErrors
from hsmon.core.trackers.base import poll_all
from hsmon.status_doc import STATUS_VERSION, DaemonInfo, JobStatus, StatusDocument, to_builtins

log = logging.getLogger("hsmon.monitor")

FULL_SCAN_EVERY = 10

TransitionListener = Callable[[JobStatus, "str | None"], None]


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
        gpu: Any = None,
        stale_after: float | None = None,
    ) -> None:
        self.scan_interval = scan_interval
        self._tick_asked = tick_interval
        self.tick_interval = min(tick_interval, scan_interval)
        # a job no tick has measured for this long reads unknown (hsmon/core/state_blind.py)
        self.stale_after = max(STALE_AFTER_S, 10 * self.tick_interval) if stale_after is None else stale_after
        self.use_watchdog = use_watchdog
        self.source = source
        self.started_ts = time.time()
        self.event_log = event_log
        self._lock = threading.RLock()
        self._tick_lock = threading.Lock()
        self._jobs: dict[str, JobRuntime] = {}
        # jobs no longer watched whose last status stays readable (and exported) until a deadline
        self._retired: dict[str, tuple[JobStatus, float]] = {}
        self._listeners: list[TransitionListener] = []
        self._tick_listeners: list[Callable[[], None]] = []
        self._change_listeners: list[Callable[[], None]] = []
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._scan_requested = threading.Event()
        self._thread: threading.Thread | None = None
        self._observer: Any = None
        self._overflow_handler: logging.Handler | None = None
        self._last_scan_mono = 0.0
        self._starting = False  # start()'s first tick: a large manifest is read in the background
        self.overflows_total = 0
        self.scans_total = 0
        self.ticks_total = 0
        self.jobs_generation = 0  # bumped when a job is added, removed or retired (a cache key)
        self.tick_seconds_last = 0.0
        self.tracker_errors = TrackerErrors()
        from hsmon.core.trackers.gpu import GpuTracker

        # NVML is loaded lazily at the first tick; ``gpu`` may be a GpuTracker (a recording in tests)
        self.gpu = gpu if gpu is not None else GpuTracker()
        for cfg in jobs or []:
            self.add_job(cfg)

    # -- jobs ---------------------------------------------------------------------------------
    def add_job(self, cfg: JobConfig) -> None:
        """Watch one more job (allowed while running). Raises ValueError on a duplicate name."""
        with self._lock:
            if cfg.name in self._jobs:
                raise ValueError(f"a job named {cfg.name!r} is already watched; pick another name")
            runtime = JobRuntime(cfg, time.time())
            runtime.gpu = self.gpu
            runtime.errors = self.tracker_errors
            if runtime.output is not None:
                runtime.output.on_read = self._wake.set  # a manifest read on a thread: tick at once
            self._jobs[cfg.name] = runtime
            self.jobs_generation += 1
        if self._thread is not None:
            self._wake.set()

    def remove_job(self, name: str) -> bool:
        with self._lock:
            runtime = self._jobs.pop(name, None)
            if runtime is not None:  # the rendered /metrics stays valid when nothing was removed
                self.jobs_generation += 1
        if runtime is not None:
            runtime.close()
        if runtime is not None and runtime.watch is not None and self._observer is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._observer.unschedule(runtime.watch)
        return runtime is not None

    def retire_job(self, name: str, grace_s: float) -> bool:
        """Stop watching a job; its last status stays in the document (and /metrics) for
        ``grace_s`` seconds, then goes."""
        with self._lock:
            runtime = self._jobs.get(name)
            doc = runtime.status(time.time()) if runtime is not None else None
        if doc is None or not self.remove_job(name):
            return False
        with self._lock:
            self._retired[name] = (doc, time.time() + grace_s)
            self.jobs_generation += 1
        return True

    def _name_from_events(self, runtime: JobRuntime) -> None:
        """A job named by default takes, once, the name its events give (their `job`)."""
        cfg = runtime.cfg
        wanted = runtime.progress.job_id if cfg.name_from_events and runtime.progress is not None else None
        if not wanted or wanted == cfg.name or not re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", wanted):
            return
        with self._lock:
            cfg.name_from_events = False
            if wanted in self._jobs or self._jobs.get(cfg.name) is not runtime:
                return  # the name is another job's: keep the default one
            del self._jobs[cfg.name]
            log.info("job %s: named %s, as its events name it", cfg.name, wanted)
            cfg.name = wanted
            self._jobs[wanted] = runtime
            self.jobs_generation += 1

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
        processes = runtime.doc.processes if runtime.doc is not None else []
        for proc in processes:
            if proc.alive:
                return proc.pid
        pid = runtime.cfg.pid
        if not processes and pid is not None and psutil.pid_exists(pid):
            return pid  # added since the last tick: its configured PID is the evidence there is
        return None

    def set_scan_interval(self, seconds: float) -> None:
        """A new reconciliation period (a reload), taken from the next tick on."""
        self.scan_interval = seconds
        self.tick_interval = min(self._tick_asked, seconds)

    def add_listener(self, listener: TransitionListener) -> None:
        """``listener(job_status, previous_state)`` after every tick for every job (a
        hsmon.status_doc.JobStatus); previous_state is not None only when the state just changed."""
        self._listeners.append(listener)

    def add_tick_listener(self, listener: Callable[[], None]) -> None:
        """``listener()`` at the end of every tick, in the tick's thread (the engine metrics render)."""
        self._tick_listeners.append(listener)

    def add_change_listener(self, listener: Callable[[], None]) -> None:
        """``listener()`` when a set of job changes is complete (``jobs_changed``: a reload), in the
        thread that made them (the exporter renders /metrics then, not the next scrape)."""
        self._change_listeners.append(listener)

    def jobs_changed(self) -> None:
        for listener in self._change_listeners:
            try:
                listener()
            except Exception:
                log.exception("change listener failed")

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
            from hsmon.core.watch import OverflowHandler

            self._overflow_handler = OverflowHandler(self.request_scan)
            wd_log = logging.getLogger("watchdog.observers")
            if wd_log.level == logging.NOTSET or wd_log.level > logging.WARNING:
                wd_log.setLevel(logging.WARNING)
            wd_log.addHandler(self._overflow_handler)
        self._starting = True
        try:
            self.tick(force_scan=True)
        finally:
            self._starting = False
        self._thread = threading.Thread(target=self._run, name="hsmon-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._lock:
            runtimes = list(self._jobs.values())
        for runtime in runtimes:
            runtime.close()
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
            poll_all([self.gpu], self.tracker_errors, "", time.time())  # the machine's trackers
            for runtime in runtimes:
                now = time.time()
                # a full listing on overflow and every FULL_SCAN_EVERY scans; between them a scan
                # lists only a directory whose mtime moved
                full = force_scan or overflow or self.scans_total % FULL_SCAN_EVERY == 0
                try:
                    previous = runtime.update(now, scan_dump=scan, scan_output=scan, full_scan=full,
                                              background=self._thread is not None or self._starting)
                except Exception as exc:  # one job's failure leaves the other jobs watched
                    self.tracker_errors.record("job", exc, runtime.cfg.name)
                    continue
                self._name_from_events(runtime)
                if self._observer is not None and runtime.dump is not None:
                    from hsmon.core.watch import ensure_watch

                    ensure_watch(self._observer, runtime)
                if runtime.doc is None:
                    continue
                if previous is not None:
                    self._log_transition(runtime, previous)
                for listener in self._listeners:
                    try:
                        listener(runtime.doc, previous)
                    except Exception:
                        log.exception("state listener failed")
            with self._lock:
                # with the tick's count, just before its render: a scrape during the tick (it may
                # take a while) still finds the last render's key and sends that text
                self._purge_retired(time.time())
                self.ticks_total += 1
            for tick_listener in self._tick_listeners:
                try:
                    tick_listener()
                except Exception:
                    log.exception("tick listener failed")
            self.tick_seconds_last = time.perf_counter() - started

    def _log_transition(self, runtime: JobRuntime, previous: str) -> None:
        machine = runtime.machine
        event = machine.events[-1]
        log.info(
            "job %s: %s -> %s (%s)",
            runtime.cfg.name,
            previous,
            machine.state,
            machine.reason or event.get("reason"),
        )
        if self.event_log is not None:
            try:
                self.event_log(event)
            except (OSError, ValueError):
                log.exception("cannot write the state event")

    # -- reading ------------------------------------------------------------------------------
    def job_statuses(self) -> list[JobStatus]:
        """The jobs' statuses, dump figures and servers live from memory."""
        now = time.time()
        with self._lock:
            runtimes = list(self._jobs.values())
            self._purge_retired(now)
            retired = [doc for doc, _ in self._retired.values()]
        # while the tick thread runs, figures age between ticks; a one-shot reader ticks itself
        stale_after = self.stale_after if self._thread is not None else None
        return [runtime.status(now, stale_after) for runtime in runtimes] + retired

    def _purge_retired(self, now: float) -> None:
        """Drop retired jobs whose grace is over (or that came back); holds ``_lock``."""
        for name in [n for n, (_, until) in self._retired.items() if until <= now or n in self._jobs]:
            del self._retired[name]
            self.jobs_generation += 1

    def status(self) -> StatusDocument:
        """The status document of docs/status-api.md, typed (hsmon.status_doc)."""
        return StatusDocument(
            v=STATUS_VERSION,
            generated_ts=time.time(),
            daemon=DaemonInfo(
                version=__version__,
                pid=os.getpid(),
                started_ts=self.started_ts,
                source=self.source,
                scans_total=self.scans_total,
                overflows_total=self.overflows_total,
                ticks_total=self.ticks_total,
                tick_seconds_last=self.tick_seconds_last,
                tracker_errors=self.tracker_errors.snapshot(),
            ),
            jobs=self.job_statuses(),
            gpus=self.gpu.section(time.time()),
        )

    def status_document(self) -> dict[str, Any]:
        """The status document as its JSON parses (plain dicts and lists: the TUI reads this)."""
        return to_builtins(self.status())

    def transitions(self) -> dict[str, dict[str, int]]:
        """job -> state -> transitions into that state (for the exporter)."""
        with self._lock:
            return {name: dict(rt.machine.transitions_by_state) for name, rt in self._jobs.items()}

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


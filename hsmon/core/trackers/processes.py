"""Process tracker: finds a job's process by PID, pidfile or command-line regex (psutil), and
measures it: alive, status, CPU seconds, RSS, I/O, threads, start time, restarts.

Also detects the original job's trap: Python writing stdout to a regular file without -u or
PYTHONUNBUFFERED (block-buffered, so the log looks dead while the job works).
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec
import psutil

from hsmon.core.config import ProcessSpec
from hsmon.core.trackers.families import add_sample as _add
from hsmon.core.trackers.families import counter as _c
from hsmon.core.trackers.families import gauge as _g
from hsmon.core.trackers.kernel import CgroupWatch, OomEvidence, oom_evidence
from hsmon.status_doc import JobStatus, ProcessEntry

_STATUS = {
    psutil.STATUS_RUNNING: "running",
    psutil.STATUS_SLEEPING: "sleeping",
    psutil.STATUS_DISK_SLEEP: "sleeping",
    psutil.STATUS_IDLE: "sleeping",
    psutil.STATUS_WAKING: "running",
    psutil.STATUS_STOPPED: "stopped",
    psutil.STATUS_TRACING_STOP: "stopped",
    psutil.STATUS_ZOMBIE: "zombie",
    psutil.STATUS_DEAD: "gone",
}


def python_unbuffered(cmdline: list[str], environ: dict[str, str]) -> bool | None:
    """True if a Python process runs unbuffered (-u or PYTHONUNBUFFERED); None if not Python."""
    if not cmdline or "python" not in os.path.basename(cmdline[0]):
        return None
    if environ.get("PYTHONUNBUFFERED"):
        return True
    args = iter(cmdline[1:])
    for arg in args:
        if not arg.startswith("-") or arg == "-" or arg.startswith("--"):
            return False  # the script (or stdin): interpreter options end here
        for i, ch in enumerate(arg[1:]):
            if ch == "u":
                return True
            if ch in "cm":
                return False  # -c CODE / -m MODULE end the interpreter options
            if ch in "XWQ":
                if i == len(arg) - 2:
                    next(args, None)  # its value is the next argument
                break
    return False


def stdout_block_buffered(cmdline: list[str], environ: dict[str, str], stdout_is_regular_file: bool) -> bool:
    """The original job's trap: Python, stdout to a regular file, neither -u nor PYTHONUNBUFFERED."""
    return stdout_is_regular_file and python_unbuffered(cmdline, environ) is False


def _read_environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return {}
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def stdout_target(pid: int, fd: int = 1) -> tuple[str | None, bool]:
    """(where fd 1 (or ``fd``) points, whether it is a regular file)."""
    try:
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
        is_reg = stat.S_ISREG(os.stat(f"/proc/{pid}/fd/{fd}").st_mode)
    except OSError:
        return None, False
    return target, is_reg


def _descends_from(proc: psutil.Process, pid: int) -> bool:
    try:
        return any(p.pid == pid for p in proc.parents())
    except psutil.Error:
        return False


class ProcessTracker:
    """One role of a job (extractor, server, trainer)."""

    def __init__(self, spec: ProcessSpec) -> None:
        self.spec = spec
        self.role = spec.role
        self._regex = re.compile(spec.match) if spec.match else None
        self._proc: psutil.Process | None = None
        self.pid: int | None = None
        self.restarts = 0
        self._fixed_ctime: float | None = None
        self.seen_alive = False
        self._last_cpu: tuple[float, float] | None = None  # (monotonic, cpu seconds)
        self._stdout_checked_pid: int | None = None
        self._stdout: tuple[str | None, bool] = (None, False)
        # regular files its stdout/stderr went to: kept after it is gone, to read how it ended
        self.log_files: list[str] = []
        self._cgroup: CgroupWatch | None = None  # the live process's memory cgroup (OOM count)
        self.oom: OomEvidence | None = None  # what the kernel said once it was gone (read once)
        self._snap: dict[str, Any] = self._gone_snapshot()

    def set_pid(self, pid: int) -> None:
        """Follow this PID (e.g. the one a job's start event names)."""
        self.spec = ProcessSpec(self.role, pid=pid)
        self._fixed_ctime = None

    def _wanted_pid(self) -> int | None:
        if self.spec.pid is not None:
            return self.spec.pid
        if self.spec.pidfile:
            try:
                with open(self.spec.pidfile) as fh:
                    return int(fh.read().split()[0])
            except (OSError, ValueError, IndexError):
                return None
        return None

    def _find_by_match(self) -> psutil.Process | None:
        assert self._regex is not None
        me = os.getpid()
        mine = {me} | {p.pid for p in psutil.Process(me).parents()}
        found = []
        for proc in psutil.process_iter(["pid", "cmdline", "create_time", "ppid"]):
            info = proc.info
            if info["pid"] in mine or not info["cmdline"]:
                continue
            if self._regex.search(" ".join(info["cmdline"])):
                found.append(proc)
        if not found:
            return None
        pids = {p.pid for p in found}
        # a shell that started the real process matches too: prefer the innermost one
        leaves = [p for p in found if not any(q.info["ppid"] == p.pid for q in found if q.pid in pids)]
        return min(leaves or found, key=lambda p: p.info["create_time"] or 0)

    def _locate(self) -> psutil.Process | None:
        # A regex is searched again on every poll: a shell found first may start the real process
        # a moment later, and the innermost match is the one to follow.
        if self._proc is not None and self._regex is None:
            try:
                if self._proc.is_running() and (self._wanted_pid() in (None, self._proc.pid)):
                    return self._proc
            except psutil.Error:
                pass
        proc = None
        try:
            if self._regex is not None:
                proc = self._find_by_match()
            else:
                pid = self._wanted_pid()
                proc = psutil.Process(pid) if pid is not None else None
                if proc is not None and self.spec.pid is not None:
                    # a fixed --pid: a later process that got the same number is not ours
                    if self._fixed_ctime is None:
                        self._fixed_ctime = proc.create_time()
                    elif proc.create_time() != self._fixed_ctime:
                        proc = None
        except (psutil.Error, OSError):
            proc = None
        if proc is not None and self._proc is not None and proc.pid == self._proc.pid:
            proc = self._proc  # keep the same handle: its CPU baseline lives there
        if proc is not None and proc.pid != self.pid:
            if self.pid is not None and not _descends_from(proc, self.pid):
                self.restarts += 1  # (a shell's child found after the shell is not a restart)
            self.pid = proc.pid
            self._last_cpu = None
        self._proc = proc
        return proc

    def _gone_snapshot(self, status: str = "gone", ended: bool = True) -> dict[str, Any]:
        return {
            "role": self.role,
            "pid": self.pid,
            "alive": False,
            "status": status,
            "cpu_seconds": None,
            "cpu_percent": None,
            "rss_bytes": None,
            "read_bytes": None,
            "write_bytes": None,
            "read_chars": None,
            "write_chars": None,
            "threads": None,
            "start_ts": None,
            "uptime_s": None,
            "restarts": self.restarts,
            "cmdline": self.spec.describe(),
            "stdout": None,
            "stdout_buffered": False,
            "oom_kill": self._kernel_evidence() if ended else None,
        }

    def _kernel_evidence(self) -> str | None:
        """Once per vanished process: the kernel's word on an OOM kill of it (else None)."""
        watch = self._cgroup
        if watch is not None and watch.pid == self.pid and self.oom is None:
            self.oom = oom_evidence(watch)
        if self.oom is None or not self.oom.killed or watch is None or watch.pid != self.pid:
            return None
        return self.oom.reason()

    def oom_hint(self) -> str | None:
        """A gone process's shared cgroup OOM count that nothing ties to it (a hint, not a verdict)."""
        watch = self._cgroup
        if self.oom is None or watch is None or watch.pid != self.pid:
            return None
        return self.oom.hint

    def poll(self) -> dict[str, Any]:
        """Measure now; returns (and keeps) the process's section of the status document."""
        proc = self._locate()
        if proc is None:
            self._snap = self._gone_snapshot()
            return self._snap
        try:
            with proc.oneshot():
                status = _STATUS.get(proc.status(), "running")
                cpu = proc.cpu_times()
                mem = proc.memory_info()
                threads = proc.num_threads()
                start = proc.create_time()
                cmdline = proc.cmdline()
            try:
                io = proc.io_counters()
            except (psutil.AccessDenied, AttributeError, NotImplementedError):
                io = None
        except psutil.NoSuchProcess:
            self._proc = None
            self._snap = self._gone_snapshot()
            return self._snap
        except psutil.ZombieProcess:
            self._snap = self._gone_snapshot("zombie")
            return self._snap
        except psutil.AccessDenied:
            self._snap = self._gone_snapshot(ended=False)
            self._snap.update(alive=True, status="running")
            return self._snap
        if status == "zombie":
            self._snap = self._gone_snapshot("zombie")
            return self._snap
        cpu_s = cpu.user + cpu.system
        mono = time.monotonic()
        pct = None
        if self._last_cpu is not None and mono > self._last_cpu[0]:
            pct = 100.0 * (cpu_s - self._last_cpu[1]) / (mono - self._last_cpu[0])
        self._last_cpu = (mono, cpu_s)
        if self._stdout_checked_pid != proc.pid:
            self._stdout_checked_pid = proc.pid
            self._stdout = stdout_target(proc.pid)
            stderr = stdout_target(proc.pid, 2)
            self.log_files = list(dict.fromkeys(
                p for p, reg in (self._stdout, stderr) if p and reg and not p.endswith(" (deleted)")
            ))
            self._buffered = stdout_block_buffered(cmdline, _read_environ(proc.pid), self._stdout[1])
            self._cgroup, self.oom = CgroupWatch.of(proc.pid), None
        elif self._cgroup is not None:
            self._cgroup.look()  # a process not of this job in its cgroup makes the OOM count a hint
        self.seen_alive = True
        now = time.time()
        self._snap = {
            "role": self.role,
            "pid": proc.pid,
            "alive": True,
            "status": status,
            "cpu_seconds": cpu_s,
            "cpu_percent": pct,
            "rss_bytes": mem.rss,
            "read_bytes": getattr(io, "read_bytes", None),
            "write_bytes": getattr(io, "write_bytes", None),
            "read_chars": getattr(io, "read_chars", None),
            "write_chars": getattr(io, "write_chars", None),
            "threads": threads,
            "start_ts": start,
            "uptime_s": max(0.0, now - start),
            "restarts": self.restarts,
            "cmdline": " ".join(cmdline)[:500],
            "stdout": self._stdout[0],
            "stdout_buffered": self._buffered,
            "oom_kill": None,
        }
        return self._snap

    def entry(self) -> ProcessEntry:
        """The typed section of the last poll (``poll`` and ``snapshot`` keep the dict view)."""
        return msgspec.convert(self.snapshot(), ProcessEntry)

    def snapshot(self) -> dict[str, Any]:
        return dict(self._snap)


# -- its Prometheus families (hsmon/core/job_trackers.py TRACKER_METRICS; docs/metrics.md) ----------------
PROCESS_STATUSES = ("running", "sleeping", "stopped", "zombie", "gone")


def metrics(jobs: Sequence[JobStatus], monitor: Any = None) -> Iterator[Any]:
    """The process families (the ``processes`` entries, labelled by role)."""
    labels = ("job", "role")
    up = _g("hsmon_process_up", "1 when the process is alive", labels)
    status = _g("hsmon_process_status", "1 for the process's current status", ("job", "role", "status"))
    cpu = _c("hsmon_process_cpu_seconds_total", "CPU seconds (user + system) of the process", labels)
    rss = _g("hsmon_process_resident_memory_bytes", "resident memory", labels)
    rd = _c("hsmon_process_read_bytes_total", "bytes read from storage", labels)
    wr = _c("hsmon_process_write_bytes_total", "bytes written to storage", labels)
    wch = _c("hsmon_process_write_chars_total", "bytes written through any file (tmpfs too)", labels)
    threads = _g("hsmon_process_threads", "threads", labels)
    start = _g("hsmon_process_start_time_seconds", "process start time", labels)
    restarts = _c("hsmon_process_restarts_total", "times the PID changed", labels)
    buffered = _g(
        "hsmon_process_stdout_buffered", "1 when Python stdout goes block-buffered to a file", labels
    )
    for job in jobs:
        for p in job.processes:
            label = [job.job, p.role]
            up.add_metric(label, 1.0 if p.alive else 0.0)
            for s in PROCESS_STATUSES:
                status.add_metric([*label, s], 1.0 if p.status == s else 0.0)
            _add(cpu, label, p.cpu_seconds)
            _add(rss, label, p.rss_bytes)
            _add(rd, label, p.read_bytes)
            _add(wr, label, p.write_bytes)
            _add(wch, label, p.write_chars)
            _add(threads, label, p.threads)
            _add(start, label, p.start_ts)
            _add(restarts, label, p.restarts)
            buffered.add_metric(label, 1.0 if p.stdout_buffered else 0.0)
    yield from (up, status, cpu, rss, rd, wr, wch, threads, start, restarts, buffered)

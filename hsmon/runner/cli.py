"""`hsmon run`: start any command so that its ending is known.

    hsmon run [--job NAME] [--events FILE] [--log FILE] [--rows-total N] -- CMD ARGS...

The command runs as a child with PYTHONUNBUFFERED=1, stdin from /dev/null and stdout+stderr
through a pipe into the log (appended, written as it arrives, rotated by size without losing the
tail). SIGTERM, SIGINT and SIGHUP are forwarded to the child's process group. Contract-1 events
go to the events file: ``start`` (command, cwd, pid, log path, rows_total), ``heartbeat`` (log
lines and bytes, so a growing log reads as progress), and at the end ``done`` (exit 0),
``stopped`` (ended after a forwarded signal) or ``error`` (exit code or signal, the log's last
lines, a Python traceback's final line as ``message``). The exit code is the child's own
(128+N when a signal N ended it).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

from hsmon.contracts import events as ev
from hsmon.contracts import stop_signals
from hsmon.contracts.progress_line import ProgressLine
from hsmon.contracts.units import format_duration, size_argument
from hsmon.core import logtail
from hsmon.runner.rotating_log import RotatingLog

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
TAIL_LINES = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job", metavar="NAME", help="job id in the events (default: the script's name)")
    parser.add_argument(
        "--events", metavar="FILE", help="contract-1 events file, appended (default: ./NAME.events.jsonl)"
    )
    parser.add_argument(
        "--log", metavar="FILE", help="its stdout+stderr, appended (default: NAME.log beside --events)"
    )
    parser.add_argument("--rows-total", type=int, metavar="N", help="rows it will write (progress, ETA)")
    parser.add_argument("--heartbeat", type=float, default=5.0, metavar="SECONDS",
                        help="seconds between heartbeat events (default 5)")
    parser.add_argument("--log-max-bytes", type=size_argument, default=64 * 1024 * 1024, metavar="SIZE",
                        help="rotate the log past this size: bytes, or 500M, 64MiB (default 64MiB)")
    parser.add_argument("--log-backups", type=int, default=3, metavar="N",
                        help="rotated logs kept: LOG.1 ... LOG.N (default 3)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")


def job_name(argv: list[str]) -> str:
    """A job id from the command: the script of `python [opts] SCRIPT`, else the program's name."""
    name = os.path.basename(argv[0])
    if "python" in name:
        rest = iter(argv[1:])
        for arg in rest:
            if arg == "-m":
                name = next(rest, name)
                break
            if arg == "-c":
                break
            if arg.startswith("-"):
                continue
            name = os.path.splitext(os.path.basename(arg))[0]
            break
    name = re.sub(r"[^A-Za-z0-9_.:-]+", "-", name).strip("-.")[:64]
    return name or "job"


def _fail(message: str) -> int:
    print(f"hsmon run: {message}", file=sys.stderr)
    return 2


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


class _Pump(threading.Thread):
    """Copies the child's output into the log as it arrives and keeps its last lines."""

    def __init__(self, fd: int, log: RotatingLog) -> None:
        super().__init__(name="hsmon-run-pump", daemon=True)
        self.fd, self.log = fd, log
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._partial = b""
        self.lock = threading.Lock()

    def run(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                break
            if not data:
                break
            try:
                self.log.write(data)
            except (OSError, ValueError):
                break  # the log closed under a grandchild that kept writing
            with self.lock:
                *lines, self._partial = (self._partial + data).split(b"\n")
                if len(self._partial) > 65536:
                    lines.append(self._partial)
                    self._partial = b""
                for line in lines[-TAIL_LINES:]:
                    self.tail.append(logtail.split_lines(line)[0])

    def last_lines(self) -> list[str]:
        with self.lock:
            lines = list(self.tail)
            if self._partial.strip():
                lines.append(logtail.split_lines(self._partial)[0])
        return lines


class Beats(threading.Thread):
    """Heartbeat events every ``every`` seconds (the log's lines and bytes: a growing log is
    progress) and, on a terminal, the progress line every second."""

    def __init__(self, writer: ev.EventWriter, log: RotatingLog, pump: _Pump, every: float,
                 started: float) -> None:
        super().__init__(name="hsmon-run-heartbeat", daemon=True)
        self.writer, self.log, self.pump, self.every, self.started = writer, log, pump, every, started
        self.line = ProgressLine("run", "log lines")
        self.quit = threading.Event()
        self.start()

    def run(self) -> None:
        next_beat = time.monotonic() + self.every
        while not self.quit.wait(min(1.0, self.every) if self.line.enabled else self.every):
            last = (self.pump.last_lines() or [""])[-1].strip()
            self.line.update(self.log.lines_total, None,
                             f"{format_duration(time.time() - self.started)} · {last[:60]}")
            if time.monotonic() >= next_beat:
                next_beat += self.every
                self.writer.emit(ev.HEARTBEAT, log_lines=self.log.lines_total, log_bytes=self.log.bytes_total,
                                 uptime_s=round(time.time() - self.started, 3))

    def close(self) -> None:
        self.quit.set()
        self.join()
        self.line.close()


def _ending(rc: int, stop_signal: int | None, tail: list[str]) -> tuple[str, dict[str, object]]:
    """The terminal event's kind and fields for the child's return code (pure)."""
    fields: dict[str, object] = {"exit_code": rc if rc >= 0 else None}
    if rc < 0:
        fields["signal"] = _signal_name(-rc)
    if stop_signal is not None:
        fields["forwarded_signal"] = _signal_name(stop_signal)
        ended_by_request = rc == 0 or -rc in FORWARDED or rc - 128 in FORWARDED
        if ended_by_request:
            return ev.STOPPED, fields
    if rc == 0:
        return ev.DONE, fields
    how = f"killed by {fields['signal']}" if rc < 0 else f"exited with code {rc}"
    fields["message"] = logtail.failure_line(tail) or how
    fields["reason"] = how
    fields["log_tail"] = tail
    return ev.ERROR, fields


def _bad_args(args: argparse.Namespace, argv: list[str], job: str) -> str | None:
    """What is wrong with ``hsmon run``'s arguments (one line naming the flag and the fix), or None."""
    if not argv:
        return "no command given; put it after --, e.g. `hsmon run -- python extract.py`"
    if args.rows_total is not None and args.rows_total <= 0:
        return f"--rows-total {args.rows_total} must be a positive number of rows"
    if args.heartbeat <= 0:
        return f"--heartbeat {args.heartbeat} must be a positive number of seconds"
    if args.log_max_bytes <= 0 or args.log_backups < 1:
        return "--log-max-bytes must be positive and --log-backups at least 1"
    if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", job):
        return f"--job {job!r} is not valid: use 1-64 letters, digits, _ . : -"
    return None


def run(args: argparse.Namespace) -> int:
    argv = list(args.command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    job = args.job or (job_name(argv) if argv else "")
    bad = _bad_args(args, argv, job)
    if bad is not None:
        return _fail(bad)
    events_path = os.path.abspath(args.events or f"{job}.events.jsonl")
    log_path = os.path.abspath(args.log or os.path.join(os.path.dirname(events_path), f"{job}.log"))
    try:
        for path in (events_path, log_path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
        log = RotatingLog(log_path, args.log_max_bytes, args.log_backups)
        writer = ev.EventWriter(job, events_path)
    except OSError as exc:
        return _fail(f"cannot open the events or log file ({exc}); give writable --events/--log paths")

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    stop_signal: list[int] = []
    child_pid: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        stop_signal.append(signum)
        for pid in child_pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signum)  # the child leads its own group: its children get it too

    for sig in FORWARDED:
        signal.signal(sig, forward)
    read_fd, write_fd = os.pipe()
    try:
        # its own process group: a terminal's Ctrl-C reaches it once, through us
        child = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=write_fd, stderr=write_fd, env=env, preexec_fn=os.setpgrp
        )
    except OSError as exc:
        os.close(read_fd)
        os.close(write_fd)
        writer.emit(ev.ERROR, message=f"cannot start {argv[0]!r}: {exc.strerror}", command=shlex.join(argv),
                    exit_code=127)
        print(f"hsmon run: cannot start {argv[0]!r}: {exc.strerror}; check the command and PATH",
              file=sys.stderr)
        return 127
    os.close(write_fd)
    started = time.time()
    child_pid.append(child.pid)
    for signum in stop_signal:  # arrived while it was starting
        os.killpg(child.pid, signum)
    pump = _Pump(read_fd, log)
    pump.start()
    start_fields = {"rows_total": args.rows_total} if args.rows_total else {}
    writer.emit(ev.START, command=shlex.join(argv), argv=argv, cwd=os.getcwd(), pid=child.pid,
                runner_pid=os.getpid(), runner="hsmon run", log=log_path, **start_fields)
    print(f"hsmon run: {job} (PID {child.pid}): its output -> {log_path}, events -> {events_path}",
          file=sys.stderr, flush=True)
    beats = Beats(writer, log, pump, args.heartbeat, started)
    rc = child.wait()
    # a grandchild that kept the pipe open must not hold the ending back
    pump.join(timeout=2.0)
    beats.close()
    kind, fields = _ending(rc, stop_signal[0] if stop_signal else None, pump.last_lines())
    writer.emit(kind, elapsed_s=round(time.time() - started, 3), log=log_path, log_lines=log.lines_total,
                log_bytes=log.bytes_total, **fields)
    writer.close()
    log.close()
    code = rc if rc >= 0 else 128 - rc
    how = {ev.DONE: "done", ev.STOPPED: f"stopped ({fields.get('forwarded_signal')})"}.get(kind)
    said = how or f"failed ({fields.get('reason')}): {fields.get('message')}"
    stop_signals.say(f"hsmon run: {job} {said} after {format_duration(time.time() - started)}, exit status "
                     f"{code}; its output: {log_path}")
    return code

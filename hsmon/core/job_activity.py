"""A job's activity clocks: when its work last moved (dump files, output) and when its processes
were last busy (CPU or I/O above idle). The state machine reads both (hsmon/core/state.py)."""

from __future__ import annotations

import time
from typing import Any

from hsmon.status_doc import DumpSection, OutputSection, ProcessEntry

# Below these a process counts as idle (a heartbeat thread, a log line now and then).
BUSY_CPU_FRACTION = 0.02
BUSY_IO_BYTES_PER_S = 16 * 1024


class ActivityClocks:
    """``last_work_ts`` and ``last_busy_ts`` of one job, moved by ``note`` once per tick."""

    def __init__(self) -> None:
        self.last_work_ts: float | None = None
        self.last_work_what = "dump/output moved"  # what moved last (the state's reason names it)
        self.last_busy_ts: float | None = None
        self._work_marks: tuple[Any, ...] | None = None
        self._last_look_ts: float | None = None
        self._busy_marks: dict[int, tuple[float, float, float]] = {}  # pid -> (mono, cpu, io)

    def note(self, now: float, procs: list[ProcessEntry], dump: DumpSection | None,
             out: OutputSection | None, file_times: list[float], dump_change_ts: float | None) -> None:
        """One look: the trackers' sections, the watched files' newest mtimes (read at the first
        look only) and the dump directory's last change seen by inotify."""
        self._note_work(now, dump, out, file_times, dump_change_ts)
        self._note_busy(now, procs)

    def note_engine(self, decoded_ts: float | None) -> None:
        """A regeneration's servers decoded answers at ``decoded_ts``: work between its rows (an
        answer of a thousand tokens takes minutes)."""
        if decoded_ts is not None and decoded_ts > (self.last_work_ts or 0.0):
            self.last_work_ts, self.last_work_what = decoded_ts, "the server decoded answers"

    def _note_work(self, now: float, dump: DumpSection | None, out: OutputSection | None,
                   file_times: list[float], change: float | None) -> None:
        marks = (
            dump and (dump.created_total, dump.consumed_total),
            out and (out.rows, out.bytes, out.temp_files, out.chunks_complete),
        )
        if self._work_marks is None:
            # first look: the files' own times say when work last happened before we watched
            self.last_work_ts = min(max(file_times), now) if file_times else None
        elif marks != self._work_marks:
            # it moved somewhere since the previous look: credit that look's time (as for CPU)
            since = self._last_look_ts if self._last_look_ts is not None else now
            self.last_work_ts = max(self.last_work_ts or 0.0, since)
            self.last_work_what = "dump/output moved"
        self._work_marks = marks
        self._last_look_ts = now
        if change is not None and (self.last_work_ts is None or change > self.last_work_ts):
            self.last_work_ts = change  # an event's time: finer than the tick

    def _note_busy(self, now: float, procs: list[ProcessEntry]) -> None:
        mono = time.monotonic()
        for proc in procs:
            if not proc.alive or proc.pid is None or proc.cpu_seconds is None:
                continue
            io = float((proc.read_chars or 0) + (proc.write_chars or 0))
            prev = self._busy_marks.get(proc.pid)
            self._busy_marks[proc.pid] = (mono, proc.cpu_seconds, io)
            if prev is None:
                # first sight: no rate yet. A process that has been busy on average over its life
                # counts as busy now (conservative: never a stall alarm before a second sample)
                uptime = proc.uptime_s or 0.0
                if uptime > 0 and proc.cpu_seconds / uptime > BUSY_CPU_FRACTION:
                    self.last_busy_ts = max(self.last_busy_ts or 0.0, now)
                continue
            if mono <= prev[0]:
                continue
            dt = mono - prev[0]
            if (proc.cpu_seconds - prev[1]) / dt > BUSY_CPU_FRACTION or (
                io - prev[2]
            ) / dt > BUSY_IO_BYTES_PER_S:
                # the work happened somewhere since the previous sample: credit it to that sample's
                # time, so that a process frozen just now does not look busy for one more tick
                self.last_busy_ts = max(self.last_busy_ts or 0.0, now - dt)

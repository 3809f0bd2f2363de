"""Facts a job's trackers give together, for ``decide`` and the status document: how the job's
process ended (its log's ending, read once; `hsmon run` still recording it) and the progress that
the events and the output directory show between them."""

from __future__ import annotations

from typing import Any

import msgspec
import psutil
from msgspec import UNSET

from hsmon.core import logtail
from hsmon.core.trackers.processes import ProcessTracker
from hsmon.core.trackers.progress import ProgressTracker
from hsmon.status_doc import LogFile, OutputSection, ProcessEntry, Progress


class EndingWatch:
    """Reads the log of a job's main process once it is gone (once per process)."""

    def __init__(self) -> None:
        self._read: tuple[Any, list[str] | None] | None = None  # ((pid, log files), their tail)

    @staticmethod
    def runner_alive(progress: ProgressTracker | None) -> bool:
        """`hsmon run` (named by the start event) still runs: it has not recorded the end yet."""
        if progress is None or not progress.runner_pid:
            return False
        try:
            proc = psutil.Process(progress.runner_pid)
            # a later process that got the same number is not ours
            started = (progress.start_ts or 0) + 1
            return proc.status() != psutil.STATUS_ZOMBIE and proc.create_time() <= started
        except psutil.Error:
            return False

    def log_tail(
        self, procs: list[ProcessEntry], tracker: ProcessTracker | None, progress: ProgressTracker | None
    ) -> tuple[str | None, list[str] | None]:
        """(the log, its last lines once the main process is gone; else None). The log is where its
        stdout/stderr went (regular files), else the one `hsmon run` names."""
        named = progress.log_path if progress else None
        main = procs[0] if procs else None
        if main is None or tracker is None or (main.alive and main.status != "zombie"):
            return named, None
        if not tracker.log_files:
            return named, None
        key = (tracker.pid, tuple(tracker.log_files))
        if self._read is None or self._read[0] != key:
            tails = [logtail.read_tail(path) for path in tracker.log_files]
            lines = [line for tail in tails if tail for line in tail]  # stderr (fd 2) last
            self._read = (key, None if all(t is None for t in tails) else lines)
        return ", ".join(tracker.log_files), self._read[1]


def job_logs(named: str | None, trackers: list[ProcessTracker]) -> list[LogFile]:
    """The job's logs: the one its start event names (``hsmon run``'s, or where hsmon extract, train
    and regenerate wrote their output), then the files its processes' stdout and stderr go to (kept
    once a process is gone), each once."""
    logs = {named: LogFile(path=named, what="the job's log (its start event)")} if named else {}
    for tracker in trackers:
        pid = f" (PID {tracker.pid})" if tracker.pid else ""
        for path in tracker.log_files:
            logs.setdefault(path, LogFile(path=path, what=f"{tracker.role} output{pid}"))
    return list(logs.values())


def merge_output_progress(
    progress: Progress | None, out: OutputSection | None, rows_total: int | None,
    out_rows_per_s: float | None,
) -> Progress | None:
    """The progress section: the events' counters, with the output directory's rows where the events
    carry none (no events file, or a writer such as `hsmon run` that counts no rows); the expected
    total from wherever it is known, and an ETA from the output's row rate."""
    if out is None:
        return progress
    if progress is None:
        return _with_plan(Progress(
            rows_done=out.rows,
            rows_total=rows_total,
            tokens_done=out.tokens,
            tokens_total=None,
            chunks_done=out.chunks_complete,
            chunks_total=None,
            rejects=None if out.rejects is UNSET else out.rejects,  # the hsmon layout's only
            rejects_by_reason=None if out.rejects_by_reason is UNSET else out.rejects_by_reason,
            rows_per_s=out_rows_per_s,
            tokens_per_s=None,
            bytes_per_s=None,
            elapsed_s=None,
            eta_s=_eta(rows_total, out.rows, out_rows_per_s),
            last_progress_ts=None,
        ), out)
    progress = msgspec.structs.replace(progress)  # a copy: the tracker's section stays its own
    if not progress.rejects_by_reason and out.rejects_by_reason:
        progress.rejects_by_reason = out.rejects_by_reason
    if progress.rows_total is None:
        progress.rows_total = rows_total
    if not progress.rows_done and out.rows:
        progress.rows_done = out.rows
        progress.rows_per_s = out_rows_per_s
        if not progress.tokens_done:
            progress.tokens_done = out.tokens
        if not progress.chunks_done:
            progress.chunks_done = out.chunks_complete
        if progress.eta_s is None:
            progress.eta_s = _eta(progress.rows_total, out.rows, out_rows_per_s)
    return _with_plan(progress, out)


def _eta(total: int | None, done: int, per_s: float | None) -> float | None:
    return max(0, total - done) / per_s if total and per_s else None


def _with_plan(progress: Progress, out: OutputSection) -> Progress:
    """Totals the events lack from the output's plan (hsmon manifest ``run`` records), and, once
    the manifest says the run ended, its duration (and no ETA left when it is done)."""
    if progress.tokens_total is None and out.tokens_total is not None:
        progress.tokens_total = out.tokens_total
    if progress.chunks_total is None and out.chunks_total is not None:
        progress.chunks_total = out.chunks_total
    if out.ending is not None and progress.elapsed_s is None:
        progress.elapsed_s = out.run_seconds
    if out.ending == "done":
        progress.eta_s = 0.0
    return progress

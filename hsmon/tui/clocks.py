"""What in a status document moves with the clock alone, so that the dashboard repaints nothing
while nothing else changes.

A frozen or finished job's document still changes every second: ``generated_ts``, the job's
``elapsed_s``, every process's ``uptime_s``, the daemon's tick counters, the reason's "progress
events 68s ago". The dashboard shows those durations with ``fmt_clock`` (seconds below a minute,
then minutes), so past a minute their text changes once a minute. A source therefore hands the app
a document only when ``quiet_signature`` (the document without its clocks) changed, or when the
app's ``clock_due`` time has come: every document while some figure shown is below a minute (or a
sparkline still moves), else at the next minute of the document's clock — one repaint a minute,
all clocks at once. No Textual here: tested without a terminal.
"""

from __future__ import annotations

import math
import re
from typing import Any

from msgspec.structs import replace

from hsmon.contracts.units import format_bytes
from hsmon.status_doc import ENDED_STATES, JobStatus, StatusDocument
from hsmon.status_doc.numbers import fmt_clock, has_short_clock

FINISHED = ENDED_STATES
# Durations of a minute or more in a reason ("68s", "125 s", "4m", "2h05m"): shown at the minute.
_LONG_CLOCK = re.compile(r"\b(?:\d+ ?s|\d+m|\d+h\d*m?)\b")
_PROCESS_DROP = dict.fromkeys(
    ("uptime_s", "cpu_seconds", "read_bytes", "write_bytes", "read_chars", "write_chars"))


def _reason_key(reason: Any) -> str:
    text = str(reason or "")
    return _LONG_CLOCK.sub(lambda m: m.group(0) if _short(m.group(0)) else "#", text)


def _short(clock: str) -> bool:
    return clock.rstrip("s ").isdigit() and int(clock.rstrip("s ")) < 60


def _clock(seconds: Any) -> str:
    return fmt_clock(seconds if isinstance(seconds, (int, float)) else None)


def _job_key(job: JobStatus) -> JobStatus:
    """The job without its clocks (a Struct compared by value; replaced fields are not checked)."""
    changes: dict[str, Any] = {"last_busy_ts": None, "reason": _reason_key(job.reason)}
    if job.progress is not None:
        changes["progress"] = replace(job.progress, elapsed_s=None, eta_s=fmt_clock(job.progress.eta_s),
                                      eta_low_s=_clock(job.progress.eta_low_s),
                                      eta_high_s=_clock(job.progress.eta_high_s))
    if job.dump is not None:
        changes["dump"] = replace(job.dump, oldest_age_s=None)
    changes["processes"] = [replace(p, **_PROCESS_DROP) for p in job.processes]
    changes["disk"] = [
        replace(d, free_bytes=format_bytes(d.free_bytes), time_to_full_s=fmt_clock(d.time_to_full_s),
                time_to_done_s=fmt_clock(d.time_to_done_s))
        for d in job.disk
    ]
    return replace(job, **changes)


def quiet_signature(document: StatusDocument) -> tuple[Any, ...]:
    """The document without what moves with the clock alone (``generated_ts``, the daemon's
    counters, elapsed, uptimes, ages; free bytes and predicted durations as shown): two documents
    with equal signatures look the same once their clocks are shown at the minute."""
    return (document.v, [_job_key(job) for job in document.jobs], replace(document.gpus, last_poll_ts=None))


_CLOCK_FIELDS = re.compile(
    rb'"(?:generated_ts|ticks_total|tick_seconds_last|scans_total|overflows_total|elapsed_s|uptime_s|'
    rb'cpu_seconds|read_bytes|write_bytes|read_chars|write_chars|oldest_age_s|last_busy_ts|last_poll_ts|'
    rb'free_bytes)": [^,}\]]*')
_REASON = re.compile(rb'"reason": "([^"\\]*)"')
_GENERATED = re.compile(rb'"generated_ts": ([0-9.eE+-]+)')


def quiet_bytes(body: bytes) -> bytes:
    """A status document's JSON text without what ``quiet_signature`` drops (the clock fields, the
    reason's durations of a minute or more) and without the free bytes of its disks (any process
    writing moves them by pages; shown as '75.4 GB', they then follow at the next document sent,
    at the latest the next minute — the verdicts `fits` and time to full are kept), read without
    parsing it. Equal for two documents: nothing else shown differs."""
    masked = _CLOCK_FIELDS.sub(b"", body)
    return _REASON.sub(
        lambda m: b'"reason": "' + _reason_key(m.group(1).decode("utf-8", "replace")).encode() + b'"', masked)


def generated_ts(body: bytes) -> float | None:
    """The document's ``generated_ts``, read without parsing it."""
    found = _GENERATED.search(body)
    try:
        return float(found.group(1)) if found else None
    except ValueError:
        return None


def _below_a_minute(value: Any) -> bool:
    return isinstance(value, (int, float)) and value < 60


def has_short_clocks(job: JobStatus, newest_event_ts: float | None, now_ts: float) -> bool:
    """Whether the job shows a duration below a minute that grows with the clock (it then changes
    every second): a young job or process, a recent event, a fresh dump file, such a reason."""
    if has_short_clock(job.reason):
        return True
    if newest_event_ts is not None and now_ts - newest_event_ts < 60:
        return True
    if job.state not in FINISHED and job.progress is not None and _below_a_minute(job.progress.elapsed_s):
        return True
    if any(p.alive and _below_a_minute(p.uptime_s) for p in job.processes):
        return True
    dump = job.dump
    return dump is not None and bool(dump.files) and _below_a_minute(dump.oldest_age_s)


def next_minute(now_ts: float) -> float:
    """The next whole minute of the document's clock."""
    return (math.floor(now_ts / 60.0) + 1.0) * 60.0

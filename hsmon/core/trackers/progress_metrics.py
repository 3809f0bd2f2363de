"""The progress tracker's Prometheus families (the ``progress``, ``training`` and ``events``
sections; hsmon/core/job_trackers.py TRACKER_METRICS; docs/metrics.md)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from hsmon.core.trackers.families import add_sample as _add
from hsmon.core.trackers.families import counter as _c
from hsmon.core.trackers.families import gauge as _g
from hsmon.status_doc import JobStatus


def metrics(jobs: Sequence[JobStatus], monitor: Any = None) -> Iterator[Any]:
    """The progress and training families (the ``progress`` and ``training`` sections)."""
    specs = [
        ("rows_done", "hsmon_rows_done", "rows done", "g"),
        ("rows_total", "hsmon_rows_planned", "rows the job will do in all", "g"),
        ("tokens_done", "hsmon_tokens_done", "tokens done", "g"),
        ("tokens_total", "hsmon_tokens_planned", "tokens the job will do in all", "g"),
        ("chunks_done", "hsmon_chunks_done", "chunks done", "g"),
        ("rejects", "hsmon_rejected_rows", "input rows rejected", "g"),
        ("rows_per_s", "hsmon_rows_per_second", "rows per second (recent window)", "g"),
        ("tokens_per_s", "hsmon_tokens_per_second", "tokens per second (recent window)", "g"),
        ("eta_s", "hsmon_eta_seconds", "estimated seconds until done", "g"),
        (
            "last_progress_ts",
            "hsmon_last_progress_timestamp_seconds",
            "when a progress event last moved",
            "g",
        ),
    ]
    families = {key: _g(name, doc) for key, name, doc, _ in specs}
    rejected = _c("hsmon_rows_rejected_total", "input rows rejected, by reason class (docs/extract.md)",
                  ("job", "reason"))
    for job in jobs:
        prog = job.progress
        if prog is None:
            continue
        for key in families:
            _add(families[key], [job.job], getattr(prog, key))
        for reason, n in (prog.rejects_by_reason or {}).items():
            rejected.add_metric([job.job, reason], n)
    yield from families.values()
    yield rejected
    step = _g("hsmon_train_step", "training step")
    loss = _g("hsmon_train_loss", "training loss at the first draft position")
    acc = _g("hsmon_train_accuracy_ratio", "training accuracy at the first draft position (0-1)")
    for job in jobs:
        tr = job.training
        if not tr:
            continue
        _add(step, [job.job], tr.step)
        for fam, value in ((loss, tr.loss), (acc, tr.acc)):
            if isinstance(value, list):
                value = value[0] if value else None
            if isinstance(value, (int, float)):
                fam.add_metric([job.job], float(value))
    yield from (step, loss, acc)


def event_metrics(jobs: Sequence[JobStatus], monitor: Any = None) -> Iterator[Any]:
    """The events file's families (the ``events`` section)."""
    lines = _c("hsmon_events_lines_total", "lines read from the events file")
    bad = _c("hsmon_events_bad_lines_total", "lines of the events file that were not valid events")
    last = _g("hsmon_events_last_timestamp_seconds", "time of the last event")
    for job in jobs:
        e = job.events
        if not e:
            continue
        _add(lines, [job.job], e.lines)
        _add(bad, [job.job], e.bad_lines)
        _add(last, [job.job], e.last_event_ts)
    yield from (lines, bad, last)

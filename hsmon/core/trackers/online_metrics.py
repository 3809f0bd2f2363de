"""An online job's Prometheus families (hsmon/core/job_trackers.py TRACKER_METRICS; docs/metrics.md),
read from the ``online`` section of each job's status (hsmon/status_doc/online.py) at scrape time."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from hsmon.core.trackers.families import add_sample as _add
from hsmon.core.trackers.families import gauge as _g
from hsmon.status_doc import JobStatus
from hsmon.status_doc.online import SIDE_STATES, online_of


def metrics(jobs: Sequence[JobStatus], monitor: Any = None) -> Iterator[Any]:
    """The spool's bytes and limit, rows waiting, both sides' rates, states and wait shares."""
    spool_bytes = _g("hsmon_spool_bytes", "bytes of rows in the spool not yet consumed by the trainer")
    limit = _g("hsmon_spool_limit_bytes", "the spool's limit (hsmon extract --spool-max)")
    waiting = _g("hsmon_spool_rows_waiting", "rows written to the spool and not yet consumed")
    written = _g("hsmon_spool_rows_written", "rows the extraction wrote to the spool (its manifests)")
    consumed = _g("hsmon_spool_rows_consumed", "rows the trainer consumed (every pass given; its ledger)")
    side = ("job", "side")
    rate = _g("hsmon_online_rows_per_second", "rows per second: extractor written, trainer consumed", side)
    wait = _g("hsmon_online_wait_ratio", "share of the last 10 min the side waited (extractor: spool "
              "room; trainer: rows)", side)
    state = _g("hsmon_online_side_state", "1 for the side's state (starting, running, paused, waiting, "
               "stalled, dead, done)", ("job", "side", "state"))
    for job in jobs:
        on = online_of(job)
        if on is None:
            continue
        _add(spool_bytes, [job.job], on.spool_bytes)
        _add(limit, [job.job], on.limit_bytes)
        _add(waiting, [job.job], on.rows_waiting)
        _add(written, [job.job], on.rows_written)
        _add(consumed, [job.job], on.rows_consumed)
        for name, s in (("extractor", on.producer), ("trainer", on.consumer)):
            _add(rate, [job.job, name], s.rows_per_s)
            _add(wait, [job.job, name], s.wait_frac)
            for st in SIDE_STATES:
                state.add_metric([job.job, name, st], 1.0 if s.state == st else 0.0)
    yield from (spool_bytes, limit, waiting, written, consumed, rate, wait, state)

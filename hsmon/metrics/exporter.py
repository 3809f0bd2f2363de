"""Prometheus exporter: a custom collector that turns the Monitor's in-memory state into metrics
(the metrics contract: hsmon_ prefix, base units, _total counters, labels job/role only), plus the engine
families (servers, GPUs) that the tick thread renders (hsmon.metrics.engine_metrics). A scrape
never touches the filesystem; while scrapes come, the tick thread renders the text after each tick
and a scrape only sends it (MetricsEndpoint). Every metric is documented in docs/metrics.md."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import InfoMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from hsmon import __version__
from hsmon.core.job_trackers import TRACKER_METRICS
from hsmon.core.state_facts import STATES
from hsmon.core.trackers.families import add_sample as _add
from hsmon.core.trackers.families import counter as _c
from hsmon.core.trackers.families import gauge as _g
from hsmon.metrics.engine_metrics import EngineExposition


class MonitorCollector(Collector):
    """Collects from ``monitor.status()`` (hsmon.status_doc) plus a few counters of its own."""

    def __init__(self, monitor: Any, extra: Any = None) -> None:
        self.monitor = monitor
        self.extra = extra  # object with notify_sent_total / notify_failed_total / control_* counters

    def collect(self) -> Iterator[Any]:
        doc = self.monitor.status()
        jobs, daemon = doc.jobs, doc.daemon
        info = InfoMetricFamily("hsmon_build", "hsmon version and source of this exporter")
        info.add_metric([], {"version": __version__, "source": daemon.source})
        yield info
        up = _g("hsmon_daemon_start_timestamp_seconds", "when the daemon started", ())
        up.add_metric([], daemon.started_ts)
        yield up
        scans = _c("hsmon_scans_total", "reconciliation scans run (periodic and on overflow)", ())
        scans.add_metric([], daemon.scans_total)
        yield scans
        overflows = _c(
            "hsmon_inotify_overflows_total", "inotify queue overflows seen (each forces a scan)", ()
        )
        overflows.add_metric([], daemon.overflows_total)
        yield overflows
        errors = _c("hsmon_tracker_errors_total", "exceptions a tracker raised (others ran on)", ("tracker",))
        for tracker, count in sorted(daemon.tracker_errors.items()):
            errors.add_metric([tracker], count)
        yield errors
        blind = _g("hsmon_tracker_blind_since_timestamp_seconds", "since when a job's tracker has failed "
                   "every call (blind: what it feeds is unknown; hsmon/core/state_blind.py)",
                   ("job", "tracker"))
        for job in jobs:
            for entry in job.blind or []:
                blind.add_metric([job.job, entry.tracker], entry.since_ts)
        yield blind
        tick = _g("hsmon_tick_duration_seconds", "how long the last monitor pass took", ())
        tick.add_metric([], daemon.tick_seconds_last)
        yield tick

        state = _g("hsmon_job_state", "1 for the job's current state, 0 for the others", ("job", "state"))
        since = _g("hsmon_job_state_since_timestamp_seconds", "when the job entered its current state")
        trans = _c("hsmon_job_transitions_total", "state transitions, by the state entered", ("job", "state"))
        hints = _g("hsmon_job_hints", "hints the job carries now, by severity", ("job", "severity"))
        hint = _g("hsmon_job_hint", "1 for each hint the job carries now (why its state)",
                  ("job", "hint", "severity"))
        stall = _g("hsmon_job_stall_after_seconds", "the job's stall-after setting")
        last_work = _g("hsmon_job_last_work_timestamp_seconds", "when dump files or output last moved")
        kind = _g("hsmon_job_info", "always 1; the job's kind (extract, train, regenerate, external)",
                  ("job", "kind"))
        transitions = self.monitor.transitions()
        for job in jobs:
            name = job.job
            for s in STATES:
                state.add_metric([name, s], 1.0 if job.state == s else 0.0)
                trans.add_metric([name, s], transitions.get(name, {}).get(s, 0))
            _add(since, [name], job.state_since_ts)
            for sev in ("info", "warning", "critical"):
                hints.add_metric([name, sev], sum(1 for h in job.hints if h.severity == sev))
            for h in job.hints:
                hint.add_metric([name, h.id, h.severity], 1.0)
            _add(stall, [name], job.stall_after_s)
            _add(last_work, [name], job.last_work_ts)
            kind.add_metric([name, job.kind or "external"], 1.0)
        yield from (state, since, trans, hints, hint, stall, last_work, kind)

        for tracker_metrics in TRACKER_METRICS:  # each tracker's families, from beside it
            yield from tracker_metrics(jobs, self.monitor)
        yield from self._extra()

    def _extra(self) -> Iterator[Any]:
        if self.extra is None or not getattr(self.extra, "active", True):
            return
        sent = _c("hsmon_notifications_sent_total", "webhook notifications delivered", ())
        failed = _c("hsmon_notifications_failed_total", "webhook notifications that failed", ())
        sent.add_metric([], getattr(self.extra, "sent_total", 0))
        failed.add_metric([], getattr(self.extra, "failed_total", 0))
        yield from (sent, failed)


PRERENDER_S = 30.0  # the tick thread renders for scrapes while one came this recently
# a rendered text older than this is never sent: a tick stuck in a call that never returns leaves
# the tick count where it was, and the scrape must then render the jobs' stale state itself
TEXT_MAX_AGE_S = 5.0


class MetricsEndpoint:
    """What /metrics serves: the job families, then the engine families as the last tick rendered
    them. Generating the text is the scrape's cost (~10 ms for the ~1,500 series of 20 jobs on a
    loaded 2-core machine, mostly prometheus_client's formatting), so while scrapes come (one in the
    last PRERENDER_S) the tick thread renders the job families after each tick and a scrape sends
    those bytes; a reload renders once it has changed the jobs (``Monitor.jobs_changed``). A scrape
    renders itself when nothing rendered since the last change it can see: a tick, or a job added,
    removed or retired since (a scrape in the middle of a reload). While the tick thread is
    rendering, a scrape sends the previous text (one tick old) rather than wait or render twice."""

    def __init__(self, monitor: Any, extra: Any = None) -> None:
        self.monitor = monitor
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(MonitorCollector(monitor, extra))
        self.engine = EngineExposition(monitor)
        self._lock = threading.Lock()
        self._text = b""
        self._key: tuple[int, int] | None = None  # (ticks, jobs generation) the text was rendered at
        self._rendered = float("-inf")  # time.monotonic() when it was
        self._rendering = False
        self._scraped = float("-inf")  # time.monotonic() of the last scrape
        self.prerenders_total = 0  # renderings by the tick thread
        self.renders_total = 0  # renderings by a scrape
        monitor.add_tick_listener(self._prerender)  # first: right after the tick's count moved
        monitor.add_tick_listener(self.engine.refresh)
        if hasattr(monitor, "add_change_listener"):  # a reload: render for the new set of jobs
            monitor.add_change_listener(self._prerender)
        self.engine.refresh()

    def _now_key(self) -> tuple[int, int] | None:
        ticks = getattr(self.monitor, "ticks_total", None)
        generation = getattr(self.monitor, "jobs_generation", None)
        return None if ticks is None or generation is None else (ticks, generation)

    def _prerender(self) -> None:
        """A tick listener: render the job families for the scrapes to come (when scrapes come)."""
        if time.monotonic() - self._scraped > PRERENDER_S:
            return
        key = self._now_key()
        with self._lock:
            self._rendering = True
        text = None
        try:
            text = generate_latest(self.registry)
        finally:
            with self._lock:
                self._rendering = False
                if text is not None:
                    self._text, self._key, self._rendered = text, key, time.monotonic()
                    self.prerenders_total += 1

    def render(self) -> bytes:
        """The whole exposition in the Prometheus text format."""
        self._scraped = now = time.monotonic()
        key = self._now_key()
        with self._lock:
            fresh = key is not None and self._key is not None and now - self._rendered <= TEXT_MAX_AGE_S and (
                self._key == key or self._rendering)
            text = self._text if fresh else None
        if text is None:
            text = generate_latest(self.registry)
            with self._lock:
                self.renders_total += 1
                if not self._rendering:
                    self._text, self._key, self._rendered = text, key, now
        return text + self.engine.text()

"""Prometheus exporter: a custom collector that turns the Monitor's in-memory state into metrics at
scrape time (contract 3: hsmon_ prefix, base units, _total counters, labels job/role only), plus
the engine families (servers, GPUs) that the tick thread renders (hsmon.metrics.engine_metrics).
A scrape never touches the filesystem. Every metric is documented in docs/metrics.md."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import InfoMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from hsmon import __version__
from hsmon.metrics.engine_metrics import EngineExposition
from hsmon.metrics.metric_families import add_sample as _add
from hsmon.metrics.metric_families import counter as _c
from hsmon.metrics.metric_families import gauge as _g
from hsmon.state import STATES
from hsmon.status_doc import DataSection, JobStatus

PROCESS_STATUSES = ("running", "sleeping", "stopped", "zombie", "gone")


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
        kind = _g("hsmon_job_info", "always 1; the job's kind (extract, train, external)", ("job", "kind"))
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

        yield from self._progress(jobs)
        yield from self._dump(jobs)
        yield from self._output(jobs)
        yield from self._disk(jobs)
        yield from self._processes(jobs)
        yield from self._events(jobs)
        yield from self._extra()

    def _progress(self, jobs: list[JobStatus]) -> Iterator[Any]:
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
        loss = _g("hsmon_train_loss", "training loss of the first unroll step")
        acc = _g("hsmon_train_accuracy_ratio", "training accuracy of the first unroll step (0-1)")
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

    def _dump(self, jobs: list[JobStatus]) -> Iterator[Any]:
        files = _g("hsmon_dump_files", "files in the dump directory")
        nbytes = _g("hsmon_dump_bytes", "bytes in the dump directory")
        oldest = _g("hsmon_dump_oldest_file_age_seconds", "age of the oldest dump file")
        created = _c("hsmon_dump_files_created_total", "dump files seen created")
        consumed = _c("hsmon_dump_files_consumed_total", "dump files seen consumed (deleted)")
        exists = _g("hsmon_dump_dir_exists", "1 when the dump directory exists")
        for job in jobs:
            d = job.dump
            if not d:
                continue
            label = [job.job]
            _add(files, label, d.files)
            _add(nbytes, label, d.bytes)
            _add(oldest, label, d.oldest_age_s)
            _add(created, label, d.created_total)
            _add(consumed, label, d.consumed_total)
            exists.add_metric(label, 1.0 if d.exists else 0.0)
        counters = self.monitor.dump_counters()
        events = _c("hsmon_dump_fs_events_total", "filesystem events handled for the dump directory")
        for name, c in counters.items():
            events.add_metric([name], c["events_total"])
        yield from (files, nbytes, oldest, created, consumed, exists, events)

    def _output(self, jobs: list[JobStatus]) -> Iterator[Any]:
        fams = {
            "chunks_complete": _g("hsmon_output_chunks_complete", "complete chunks in the output directory"),
            "chunks_in_progress": _g("hsmon_output_chunks_in_progress", "chunks being written"),
            "rows": _g("hsmon_output_rows", "rows in the output directory"),
            "tokens": _g("hsmon_output_tokens", "tokens in the output directory (when known)"),
            "bytes": _g("hsmon_output_bytes", "bytes of complete rows in the output directory"),
            "temp_files": _g("hsmon_output_temp_files", "files still being written (hidden temporaries)"),
        }
        for job in jobs:
            out = job.output
            if not out:
                continue
            for key, fam in fams.items():
                _add(fam, [job.job], getattr(out, key))
        yield from fams.values()
        yield from _data_facts(jobs)

    def _disk(self, jobs: list[JobStatus]) -> Iterator[Any]:
        labels = ("job", "role")
        fams = {
            "free_bytes": _g("hsmon_disk_free_bytes", "free bytes on the filesystem", labels),
            "total_bytes": _g("hsmon_disk_size_bytes", "size of the filesystem", labels),
            "needed_bytes": _g("hsmon_disk_needed_bytes", "bytes the job still needs to write", labels),
            "write_bytes_per_s": _g("hsmon_disk_write_bytes_per_second", "how fast the job fills it", labels),
            "time_to_full_s": _g(
                "hsmon_disk_time_to_full_seconds", "seconds until full at that rate", labels
            ),
            "time_to_done_s": _g("hsmon_disk_time_to_done_seconds", "seconds until the job is done", labels),
        }
        fits = _g(
            "hsmon_disk_fits", "1 if what the job still writes fits, 0 if not (absent: unknown)", labels
        )
        for job in jobs:
            for d in job.disk:
                label = [job.job, d.role]
                for key, fam in fams.items():
                    _add(fam, label, getattr(d, key))
                if d.fits is not None:
                    fits.add_metric(label, 1.0 if d.fits else 0.0)
        yield from (*fams.values(), fits)

    def _processes(self, jobs: list[JobStatus]) -> Iterator[Any]:
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

    def _events(self, jobs: list[JobStatus]) -> Iterator[Any]:
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

    def _extra(self) -> Iterator[Any]:
        if self.extra is None:
            return
        sent = _c("hsmon_notifications_sent_total", "webhook notifications delivered", ())
        failed = _c("hsmon_notifications_failed_total", "webhook notifications that failed", ())
        sent.add_metric([], getattr(self.extra, "sent_total", 0))
        failed.add_metric([], getattr(self.extra, "failed_total", 0))
        yield from (sent, failed)


class MetricsEndpoint:
    """What /metrics serves: the job families collected at scrape time, then the engine families as
    the last tick rendered them. Registers its engine renderer as a tick listener of ``monitor``."""

    def __init__(self, monitor: Any, extra: Any = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(MonitorCollector(monitor, extra))
        self.engine = EngineExposition(monitor)
        monitor.add_tick_listener(self.engine.refresh)
        self.engine.refresh()

    def render(self) -> bytes:
        """The whole exposition in the Prometheus text format."""
        return generate_latest(self.registry) + self.engine.text()


def _data_facts(jobs: list[JobStatus]) -> Iterator[Any]:
    """Per-layer statistics of the hidden states written (output.data, hsmon/contracts/data_facts.py)."""
    by_layer = ("job", "layer")
    run = {
        "mean_l2": _g("hsmon_output_layer_mean_l2_norm", "mean L2 norm per token of the layer's "
                      "hidden states, over the run", by_layer),
        "std": _g("hsmon_output_layer_std", "std of the layer's values, over the run", by_layer),
        "max_abs": _g("hsmon_output_layer_max_abs", "largest finite |x| of the layer", by_layer),
        "nonfinite_values": _g("hsmon_output_layer_nonfinite_values", "NaN/Inf values of the layer",
                               by_layer),
        "nonfinite_rows": _g("hsmon_output_layer_nonfinite_rows", "rows with NaN/Inf in the layer",
                             by_layer),
    }
    chunk = {
        "mean_l2": _g("hsmon_output_layer_chunk_mean_l2_norm", "mean L2 norm per token in the newest "
                      "complete chunk", by_layer),
        "std": _g("hsmon_output_layer_chunk_std", "std in the newest complete chunk", by_layer),
    }
    ratio = _g("hsmon_output_layer_chunk_drift_ratio", "newest chunk's mean L2 norm over the reference "
               "chunks' (1 = no drift)", by_layer)
    rows = _g("hsmon_output_nonfinite_rows", "rows whose hidden states hold NaN/Inf (any layer)")
    drifted = _g("hsmon_output_drifted_chunks", "chunks whose statistics moved beyond the drift tolerance")
    for job in jobs:
        data = _data(job)
        if data is None:
            continue
        name = job.job
        _add(rows, [name], data.nonfinite_rows)
        _add(drifted, [name], data.drifted_chunks)
        for layer, facts in data.layers.items():
            for key, fam in run.items():
                _add(fam, [name, layer], getattr(facts, key))
            newest, ref = facts.chunk, facts.reference
            for key, fam in chunk.items():
                _add(fam, [name, layer], getattr(newest, key) if newest else None)
            if newest is not None and newest.mean_l2 is not None and ref is not None and ref.mean_l2:
                ratio.add_metric([name, layer], newest.mean_l2 / ref.mean_l2)
    yield from (*run.values(), *chunk.values(), ratio, rows, drifted)
    yield from _verify(jobs)


def _verify(jobs: list[JobStatus]) -> Iterator[Any]:
    """The engine check during the run (output.data.verify, hsmon/verify_watch.py)."""
    checks = _c("hsmon_verify_checks_total", "engine checks finished, by verdict (agree, disagree, error, "
                "timeout)", ("job", "verdict"))
    cosine = _g("hsmon_verify_worst_cosine", "lowest per-token cosine of the last engine check (1 = equal)")
    diff = _g("hsmon_verify_max_abs_diff", "largest absolute difference of the last engine check")
    last = _g("hsmon_verify_last_timestamp_seconds", "when the last engine check finished")
    disagree = _g("hsmon_verify_disagree", "1 when the last engine check disagreed with the data, else 0")
    for job in jobs:
        data = _data(job)
        v = data.verify if data is not None else None
        if not v:
            continue
        name = job.job
        for verdict in ("agree", "disagree", "error", "timeout"):
            checks.add_metric([name, verdict], v.checks_by_verdict.get(verdict, 0))
        _add(cosine, [name], v.worst_cosine)
        _add(diff, [name], v.max_abs_diff)
        _add(last, [name], v.checked_ts)
        disagree.add_metric([name], 1.0 if v.verdict == "disagree" else 0.0)
    yield from (checks, cosine, diff, last, disagree)


def _data(job: JobStatus) -> DataSection | None:
    """The job's ``output.data`` (hsmon layout only), or None."""
    data = job.output.data if job.output is not None else None
    return data if isinstance(data, DataSection) else None

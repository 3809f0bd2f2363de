"""The inference engine's metric families (SGLang servers and GPUs), rendered once per monitor tick.

Servers and GPUs are sampled on their own schedules (liveness every few seconds, /health_generate
every 15 s, NVML every 5 s), so their exposition is rendered by the tick thread right after it
reads them, and a scrape copies the latest bytes: watching 4 servers and 8 GPUs adds ~100 series
but nothing to the scrape's own time (bench/server_watch.py). The families are the metrics contract's and
are documented in docs/metrics.md like every other.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import InfoMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from hsmon.core.trackers.families import add_sample as _add
from hsmon.core.trackers.families import counter as _c
from hsmon.core.trackers.families import gauge as _g
from hsmon.core.trackers.server_rules import SERVER_STATES
from hsmon.status_doc import GpuSection, JobStatus, StatusDocument

# servers[i].capture keys exported as hsmon_server_capture_<key> (counters get _total), kind, help
CAPTURE_FAMILIES = (
    ("requests", "counter", "opted-in requests through the capture plugin's hook"),
    ("files_written", "counter", "dump files the plugin's writer thread wrote"),
    ("write_errors", "counter", "dumps that failed to write (each left a <rid>.error)"),
    ("sync_fallbacks", "counter", "requests written on the scheduler thread (the host pool was full)"),
    ("buffer_reuses", "counter", "later forwards seen on memory the plugin still held"),
    ("write_seconds", "counter", "seconds the plugin's writer thread spent writing"),
    ("hook_seconds", "counter", "seconds spent in the plugin's hook on the scheduler's thread"),
    ("queue_depth", "gauge", "requests queued for the plugin's writer thread"),
    ("pool_bytes_in_use", "gauge", "host bytes the plugin holds for its writer"),
    ("pool_bytes_max", "gauge", "the plugin's host pool limit"),
    ("hook_seconds_p99", "gauge", "99th percentile of the hook's time per request, recent requests"),
)


class EngineCollector(Collector):
    """The server and GPU families of one status document (its ``jobs`` and ``gpus``)."""

    def __init__(self, jobs: list[JobStatus], gpus: GpuSection) -> None:
        self.jobs = jobs
        self.gpus = gpus

    def collect(self) -> Iterator[Any]:
        yield from self._servers()
        yield from self._captures()
        yield from self._speculative()
        yield from self._gpus()

    def _servers(self) -> Iterator[Any]:
        labels = ("job", "server")
        up = _g("hsmon_server_up", "1 when the server's HTTP front answers", labels)
        state = _g(
            "hsmon_server_state", "1 for the server's state (up busy hung down unknown)", (*labels, "state")
        )
        latency = _g(
            "hsmon_server_health_generate_seconds", "how long the last /health_generate took", labels
        )
        failures = _c(
            "hsmon_server_health_generate_failures_total", "/health_generate that failed or timed out", labels
        )
        forward = _g(
            "hsmon_server_last_forward_timestamp_seconds",
            "when a forward last completed on the server",
            labels,
        )
        info = InfoMetricFamily("hsmon_server", "the server's model and version", labels=list(labels))
        loads = {
            "running": _g("hsmon_server_running_requests", "requests the server is running", labels),
            "queued": _g("hsmon_server_queued_requests", "requests waiting in the server's queue", labels),
            "token_usage": _g("hsmon_server_token_usage_ratio", "KV cache in use (0-1)", labels),
            "gen_tokens_per_s": _g(
                "hsmon_server_generation_tokens_per_second", "tokens generated per second", labels
            ),
            "prompt_tokens_per_s": _g(
                "hsmon_server_prompt_tokens_per_second", "prompt tokens processed per second", labels
            ),
        }
        for job in self.jobs:
            for srv in job.servers:
                label = [job.job, srv.url]
                up.add_metric(label, 1.0 if srv.reachable else 0.0)
                for s in SERVER_STATES:
                    state.add_metric([*label, s], 1.0 if srv.state == s else 0.0)
                _add(latency, label, srv.health.latency_s)
                _add(failures, label, srv.health.failures_total)
                _add(forward, label, srv.last_forward_ts)
                version = srv.info.version if srv.info is not None else None
                if srv.model or version:
                    info.add_metric(label, {"model": str(srv.model or ""), "version": str(version or "")})
                for key, fam in loads.items():
                    _add(fam, label, getattr(srv.load, key))
        yield from (up, state, latency, failures, forward, info, *loads.values())

    def _captures(self) -> Iterator[Any]:
        """The capture plugin's counters of each server (``servers[i].capture``; none without it)."""
        labels = ("job", "server")
        fams = {key: (_c if kind == "counter" else _g)(f"hsmon_server_capture_{key}", doc, labels)
                for key, kind, doc in CAPTURE_FAMILIES}
        for job in self.jobs:
            for srv in job.servers:
                if srv.capture is not None:
                    for key, fam in fams.items():
                        _add(fam, [job.job, srv.url], getattr(srv.capture, key))
        yield from fams.values()

    def _speculative(self) -> Iterator[Any]:
        """A speculative server's acceptance (``servers[i].speculative``; none for other servers)."""
        labels = ("job", "server")
        fams = {
            "accept_length": _g("hsmon_server_spec_accept_length", "tokens per verify over SGLang's last "
                                "decode window (/metrics), else its average since start", labels),
            "accept_rate": _g("hsmon_server_spec_accept_rate", "accepted / proposed drafts (SGLang)", labels),
            "verify_calls_total": _c("hsmon_server_spec_verify_calls", "SGLang's speculative verify calls "
                                     "(finished requests)", labels),
            "generated_tokens_total": _c("hsmon_server_spec_generated_tokens", "tokens the speculative "
                                         "server generated (finished requests)", labels),
            "estimate": _g("hsmon_server_spec_accept_length_estimate", "the served drafter's own "
                           "training-time estimate of tokens per verify at the server's depth", labels),
            "depth": _g("hsmon_server_spec_depth", "drafted tokens per verify", labels),
        }
        for job in self.jobs:
            for srv in job.servers:
                spec = srv.speculative
                if spec is None:
                    continue
                label = [job.job, srv.url]
                length = spec.accept_length if spec.accept_length is not None else spec.avg_accept_length
                _add(fams["accept_length"], label, length)
                for key, fam in fams.items():
                    if key != "accept_length":
                        _add(fam, label, getattr(spec, key))
        yield from fams.values()

    def _gpus(self) -> Iterator[Any]:
        available = _g("hsmon_gpu_available", "1 when NVML answers (0: no driver or no nvidia-ml-py)", ())
        available.add_metric([], 1.0 if self.gpus.available else 0.0)
        labels = ("gpu",)
        fams = {
            "utilization": _g("hsmon_gpu_utilization_ratio", "GPU utilization (0-1)", labels),
            "memory_used_bytes": _g("hsmon_gpu_memory_used_bytes", "GPU memory in use", labels),
            "memory_total_bytes": _g("hsmon_gpu_memory_total_bytes", "GPU memory in all", labels),
            "power_watts": _g("hsmon_gpu_power_watts", "GPU power draw", labels),
            "temperature_celsius": _g("hsmon_gpu_temperature_celsius", "GPU temperature", labels),
        }
        for dev in self.gpus.devices:
            for key, fam in fams.items():
                _add(fam, [str(dev.index)], getattr(dev, key))
        used = _g("hsmon_job_gpu", "1 for each GPU on which the job's processes hold memory", ("job", "gpu"))
        for job in self.jobs:
            for index in job.gpu.indices:
                used.add_metric([job.job, str(index)], 1.0)
        yield from (available, *fams.values(), used)


def render_engine(doc: StatusDocument) -> bytes:
    """The engine families of a status document in the Prometheus text format."""
    return generate_latest(EngineCollector(doc.jobs, doc.gpus))


class EngineExposition:
    """The engine families as the last tick saw them; ``refresh`` is a Monitor tick listener."""

    def __init__(self, monitor: Any) -> None:
        self.monitor = monitor
        self._lock = threading.Lock()
        self._text = b""

    def refresh(self) -> None:
        """Render from the monitor's memory (called by the tick thread after each tick)."""
        text = render_engine(self.monitor.status())
        with self._lock:
            self._text = text

    def text(self) -> bytes:
        """The latest rendering (empty before the first tick)."""
        with self._lock:
            return self._text

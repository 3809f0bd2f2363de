"""The server tracker's pure rules: load figures from a server's Prometheus text, and the state
from the last measurements (hsmon/trackers/server.py measures; this decides; no I/O here)."""

from __future__ import annotations

from typing import Any

SERVER_STATES = ("up", "busy", "hung", "down", "unknown")
# Series of the server's /metrics, by name without the engine prefix (sglang:, vllm:), first found wins.
LOAD_SERIES: dict[str, tuple[str, ...]] = {
    "running": ("num_running_reqs", "num_requests_running"),
    "queued": ("num_queue_reqs", "num_requests_waiting"),
    "token_usage": ("token_usage", "kv_cache_usage_perc", "gpu_cache_usage_perc"),
    "gen_throughput": ("gen_throughput",),
    "generation_tokens_total": ("generation_tokens_total",),
    "prompt_tokens_total": ("prompt_tokens_total",),
}
_WANTED = frozenset(name for names in LOAD_SERIES.values() for name in names)
# Labels that only say which replica of the same figure a sample is (tensor/pipeline ranks).
_REPLICA_LABELS = frozenset({"tp_rank", "pp_rank", "moe_ep_rank", "attn_tp_rank", "pid"})



def parse_load(text: str) -> dict[str, float]:
    """Load figures from a server's Prometheus text (prometheus_client's parser); missing ones absent.

    Replicas of one figure (per tensor-parallel rank) count once; data-parallel groups add up.
    Raises ValueError when a line of those series is not Prometheus exposition.
    """
    from prometheus_client.parser import text_string_to_metric_families

    # SGLang exports ~700 lines (histograms mostly); parsing them all costs ~25 ms a look. Only the
    # lines of the series read here go to the parser, picked by their metric name.
    lines = [
        line
        for line in text.splitlines()
        if line[:1] not in ("#", "") and line.split("{", 1)[0].split(" ", 1)[0].split(":", 1)[-1] in _WANTED
    ]
    values: dict[str, dict[tuple[Any, ...], float]] = {}
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            short = sample.name.split(":", 1)[-1]
            key = tuple(sorted((k, v) for k, v in sample.labels.items() if k not in _REPLICA_LABELS))
            group = values.setdefault(short, {})
            group[key] = max(group.get(key, float("-inf")), float(sample.value))
    load: dict[str, float] = {}
    for field, names in LOAD_SERIES.items():
        for name in names:
            if name in values:
                groups = values[name].values()
                load[field] = max(groups) if field == "token_usage" else sum(groups)
                break
    return load


def server_state(
    now: float,
    *,
    looked: bool,
    reachable: bool,
    not_sglang: bool,
    front_error: str | None,
    health_in_flight_since: float | None,
    health_ok: bool | None,
    health_latency_s: float | None,
    health_error: str | None,
    health_timeout: float,
    busy_after: float,
) -> tuple[str, str]:
    """(state, one-line detail) from the last measurements; pure."""
    if not looked:
        return "unknown", "not looked at yet"
    if not reachable:
        return "down", front_error or "no answer"
    if not_sglang:
        return "unknown", "answers HTTP but is not an SGLang server (no /metrics, /model_info, /v1/models)"
    in_flight = None if health_in_flight_since is None else max(0.0, now - health_in_flight_since)
    if in_flight is not None and in_flight > health_timeout:
        return "hung", f"the HTTP front answers but /health_generate has not come back in {in_flight:.0f} s"
    if health_ok is False:
        return "hung", f"the HTTP front answers but /health_generate failed ({health_error})"
    if in_flight is not None and in_flight > busy_after:
        return "busy", f"/health_generate pending for {in_flight:.0f} s"
    if health_ok and health_latency_s is not None and health_latency_s > busy_after:
        return "busy", f"/health_generate took {health_latency_s:.1f} s"
    if health_ok is None:
        return "up", "the HTTP front answers; no forward checked yet"
    return "up", f"/health_generate answered in {health_latency_s or 0:.1f} s"

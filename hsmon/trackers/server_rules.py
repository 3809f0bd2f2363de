"""The server tracker's pure parsing: load figures and progress counters from a server's Prometheus
text (hsmon/trackers/server.py measures; hsmon/state_server.py decides the state; no I/O here)."""

from __future__ import annotations

from typing import Any

from hsmon.state_server import SERVER_STATES, ServerLook, decide_server

__all__ = ["COUNTERS", "LOAD_SERIES", "SERVER_STATES", "ServerLook", "decide_server", "parse_load"]
# Series of the server's /metrics, by name without the engine prefix (sglang:, vllm:), first found wins.
LOAD_SERIES: dict[str, tuple[str, ...]] = {
    "running": ("num_running_reqs", "num_requests_running"),
    "queued": ("num_queue_reqs", "num_requests_waiting"),
    "token_usage": ("token_usage", "kv_cache_usage_perc", "gpu_cache_usage_perc"),
    "gen_throughput": ("gen_throughput",),
    "generation_tokens_total": ("generation_tokens_total",),
    "prompt_tokens_total": ("prompt_tokens_total",),
    # counted by the scheduler after each forward batch (a prefill chunk moves it), by mode
    "scheduler_tokens_total": ("realtime_tokens_total",),
    "requests_total": ("num_requests_total", "request_success_total"),
}
# Counters that move only when forwards complete: (load field, words for a reason), in that order.
COUNTERS = (
    ("prompt_tokens_total", "prompt tokens"),
    ("scheduler_tokens_total", "the scheduler's token counts"),
    ("generation_tokens_total", "generation tokens"),
    ("requests_total", "finished requests"),
)
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


def info_of(data: dict[str, Any]) -> dict[str, Any]:
    """The ``info`` of a server's status entry from its ``/server_info`` answer."""
    return {
        "version": data.get("version"),
        "model": data.get("model_path"),
        "tp_size": data.get("tp_size"),
        "dp_size": data.get("dp_size"),
        "enable_metrics": data.get("enable_metrics"),
        "enable_return_hidden_states": data.get("enable_return_hidden_states"),
        "enable_return_aux_hidden_states": data.get("enable_return_aux_hidden_states"),
        "aux_hidden_state_layer_ids": data.get("return_aux_hidden_state_layer_ids"),
        "max_total_tokens": data.get("max_total_tokens"),
    }

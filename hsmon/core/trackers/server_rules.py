"""The server tracker's pure parsing: load figures and progress counters from a server's Prometheus
text (hsmon/core/trackers/server.py measures; hsmon/core/state_server.py decides the state; no I/O here)."""

from __future__ import annotations

from typing import Any

from hsmon.core.state_server import SERVER_STATES, ServerLook, decide_server

__all__ = ["COUNTERS", "LOAD_SERIES", "SERVER_STATES", "ServerLook", "decide_server", "decode_moved",
           "parse_load"]
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
    # a speculative server's acceptance (server_spec.py): gauges averaged over data-parallel groups
    "spec_accept_length": ("spec_accept_length",),
    "spec_accept_rate": ("spec_accept_rate",),
    # SGLang's verify calls; vLLM's verifying forwards that had drafts
    "spec_verify_calls_total": ("spec_verify_calls_total", "spec_decode_num_drafts_total"),
    # vLLM's drafted and accepted tokens (its acceptance since start: server_spec.py)
    "spec_draft_tokens_total": ("spec_decode_num_draft_tokens_total",),
    "spec_accepted_tokens_total": ("spec_decode_num_accepted_tokens_total",),
}
_MEANS = frozenset({"spec_accept_length", "spec_accept_rate"})
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
    decoded = [v for key, v in values.get("realtime_tokens_total", {}).items() if ("mode", "decode") in key]
    if decoded:  # decode steps alone: answers being generated (a health check or a prefill makes none)
        load["decode_tokens_total"] = sum(decoded)
    for field, names in LOAD_SERIES.items():
        for name in names:
            if name in values:
                groups = values[name].values()
                if field == "token_usage":
                    load[field] = max(groups)
                else:
                    load[field] = sum(groups) / (len(groups) if field in _MEANS else 1)
                break
    return load


# Generation tokens between two looks that hsmon's own /health_generate can account for (one token
# each, one check in flight): more than this is someone's answers (a server without decode counts).
OWN_CHECK_TOKENS = 2


def decode_moved(before: dict[str, float], after: dict[str, float]) -> bool:
    """Whether answers were decoded between two looks at a server's load: its scheduler's decode
    tokens moved, or (an SGLang without them) its finished generation tokens moved by more than
    hsmon's own checks account for. A prefill, an extraction's one-token requests and a health
    check decode nothing."""
    for field, floor in (("decode_tokens_total", 0), ("generation_tokens_total", OWN_CHECK_TOKENS)):
        if field in after and field in before:
            return after[field] - before[field] > floor
    return False


def info_of(data: dict[str, Any]) -> dict[str, Any]:
    """The ``info`` of a server's status entry from its ``/server_info`` answer (a value of an
    unexpected type reads as unknown: the status document's types hold)."""
    ids = data.get("return_aux_hidden_state_layer_ids")
    return {
        "version": _of(data.get("version"), str),
        "model": _of(data.get("model_path"), str),
        "tp_size": _of(data.get("tp_size"), int),
        "dp_size": _of(data.get("dp_size"), int),
        "enable_metrics": _of(data.get("enable_metrics"), bool),
        "enable_return_hidden_states": _of(data.get("enable_return_hidden_states"), bool),
        "enable_return_aux_hidden_states": _of(data.get("enable_return_aux_hidden_states"), bool),
        "aux_hidden_state_layer_ids": ids if isinstance(ids, list) and all(
            type(i) is int for i in ids) else None,
        "max_total_tokens": _of(data.get("max_total_tokens"), int),
        "engine": _of(data.get("engine"), str) or "sglang",
    }


def _of(value: Any, kind: type) -> Any:
    """``value`` if it is of ``kind`` (a bool is no int here), else None."""
    if kind is int:
        return value if type(value) is int else None
    return value if isinstance(value, kind) else None

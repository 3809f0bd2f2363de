"""The engine's sections: a job's inference servers (hsmon/core/trackers/server.py) and the host's GPUs
(hsmon/core/trackers/gpu.py, the top-level ``gpus``)."""

from __future__ import annotations

from hsmon.status_doc.base import Num, Section


class ServerInfo(Section, omit_defaults=True):
    """What the server's ``/server_info`` said after the last connect."""

    version: str | None
    model: str | None
    tp_size: int | None
    dp_size: int | None
    enable_metrics: bool | None
    enable_return_hidden_states: bool | None
    enable_return_aux_hidden_states: bool | None
    aux_hidden_state_layer_ids: list[int] | None
    max_total_tokens: int | None
    engine: str | None = None  # "sglang" or "vllm" (vLLM has no /server_info: its /v1/models, /version)


class Health(Section):
    """The ``/health_generate`` checks (a real forward)."""

    ok: bool | None
    latency_s: Num | None
    error: str | None
    last_ts: float | None
    last_ok_ts: float | None
    in_flight_s: Num | None
    checks_total: int
    failures_total: int
    failures_in_row: int
    unanswered_s: Num | None
    sglang_timeout_s: Num | None
    sglang_timeout_source: str | None


class Load(Section):
    """The server's load from its ``/metrics`` (null without ``--enable-metrics``)."""

    running: Num | None
    queued: Num | None
    token_usage: Num | None
    gen_tokens_per_s: Num | None
    prompt_tokens_per_s: Num | None


class Capture(Section, omit_defaults=True):
    """hsmon's capture plugin inside the server, summed over its schedulers."""

    schedulers: int
    plugin_version: str | None
    requests: int
    files_written: int
    write_errors: int
    sync_fallbacks: int
    buffer_reuses: int
    queue_depth: int
    pool_bytes_in_use: int
    pool_bytes_max: int
    write_seconds: Num
    hook_seconds: Num
    hook_seconds_p50: Num | None
    hook_seconds_p99: Num | None
    read_ts: float
    # the SGLang release and the plugin's capture adapter in it (docs/extract.md's support
    # table); optional: left out of the document (omit_defaults) when the plugin does not say
    sglang_version: str | None = None
    adapter: str | None = None
    # what the engine really does: the model class SGLang loaded, its parallel sizes, the class's
    # layer rule (hsmon.contracts.capture_points.RULES), the points its model captures (read back
    # from the class by the plugin) and which rank writes; absent when the server does not say
    model_class: str | None = None
    tp_size: int | None = None
    dp_size: int | None = None
    ep_size: int | None = None
    capture_rule: str | None = None
    captured_points: list[int] | None = None
    writer: str | None = None


class Speculative(Section, omit_defaults=True):
    """A server that decodes speculatively (EAGLE): its drafter and its acceptance as SGLang
    reports it, beside the drafter's training-time estimate at the same depth."""

    algorithm: str | None = None
    draft_model: str | None = None  # the drafter's directory, as the server names it
    depth: int | None = None  # drafted tokens per verify (--speculative-num-steps at top-k 1)
    draft_tokens: int | None = None  # tokens per verify, the last verified one included
    topk: int | None = None
    # SGLang's /metrics (with --enable-metrics): its gauges over its last decode window (logged
    # every 40 decode steps by default): tokens per verify (accepted drafts + 1, spec_accept_length)
    # and accepted / proposed drafts; and its counters of finished requests' verify calls and
    # generated tokens, whose ratio is tokens per verify over everything served (SGLang's own
    # per-request spec_accept_length, pooled)
    accept_length: Num | None = None
    accept_rate: Num | None = None
    verify_calls_total: Num | None = None
    generated_tokens_total: Num | None = None
    # /server_info's avg_spec_accept_length: since the server started
    avg_accept_length: Num | None = None
    # the drafter's own estimate at ``depth`` (its export's hsmon_estimate: hsmon train's held-out
    # evaluation), read from the drafter's directory when the daemon can read it
    estimate: Num | None = None
    estimate_source: str | None = None


class ServerEntry(Section):
    """One inference server a job talks to."""

    url: str
    state: str  # up | busy | hung | down | unknown
    detail: str
    model: str | None
    info: ServerInfo | None
    reachable: bool
    liveness_endpoint: str | None
    last_seen_ts: float | None
    connects_total: int
    metrics_enabled: bool | None
    metrics_error: str | None
    health: Health
    last_forward_ts: float | None
    capture: Capture | None
    load: Load
    speculative: Speculative | None = None  # null: the server does not decode speculatively


class GpuProcess(Section):
    """A process holding memory on a GPU."""

    pid: int
    used_memory_bytes: int | None


class GpuDevice(Section):
    """One GPU as NVML reads it (base units: bytes, watts, ratio 0-1)."""

    index: int
    name: str | None
    utilization: Num | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    power_watts: Num | None
    temperature_celsius: Num | None
    processes: list[GpuProcess]
    zero_since_ts: float | None  # since when this GPU has read 0 %


class GpuSection(Section):
    """The host's GPUs (``available`` false, with the reason, without NVML)."""

    available: bool
    reason: str | None
    last_poll_ts: float | None
    devices: list[GpuDevice]

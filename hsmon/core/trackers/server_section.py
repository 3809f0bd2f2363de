"""What a server tracker (hsmon/core/trackers/server.py) hands on: the measurements its state rule reads
(``look_of`` -> server_rules.ServerLook) and its entry of the status document (``entry_of`` ->
status_doc.ServerEntry). Both read the tracker's fields with its lock held; no I/O."""

from __future__ import annotations

from typing import Any

from hsmon.core.state_facts import age
from hsmon.core.trackers.server_rules import ServerLook
from hsmon.core.trackers.server_spec import speculative_of
from hsmon.status_doc import Health, Load, ServerEntry, ServerInfo

# a hsmon.core.trackers.server.ServerTracker (not imported: it imports this module)
ServerTracker = Any


def look_of(t: ServerTracker, now: float) -> ServerLook:
    """The measurements the state rule (server_rules.decide_server) reads."""
    return ServerLook(
        now=now,
        health_timeout=t.spec.health_timeout,
        busy_after=t.spec.busy_after,
        looked=t.looked,
        reachable=t.reachable,
        not_sglang=t.not_sglang,
        front_error=t.front_error,
        front_unanswered_since=t.front_unanswered_since,
        front_timeouts=t.front_timeouts,
        health_in_flight_since=t.health_in_flight_since,
        health_ok=t.health_ok,
        health_latency_s=t.health_latency_s,
        health_error=t.health_error,
        unanswered_since=t.health_unanswered_since,
        failures_in_row=t.health_failures_in_row,
        last_ok_ts=t.health_last_ok_ts,
        counters_moved_ts=t.last_counters_moved_ts,
        counters_moved=t.counters_moved,
        counters_read=t.counters_read,
        job_progress_ts=t.job_progress_ts,
        sglang_timeout_s=t.sglang_timeout[0] if t.sglang_timeout else None,
        running=t.load.get("running"),
        queued=t.load.get("queued"),
    )


def entry_of(t: ServerTracker, now: float, state: str, detail: str) -> ServerEntry:
    """The ``servers[]`` entry of the status document, in the state ``decide_server`` gave."""
    load, timeout = t.load, t.sglang_timeout
    gauge = load.get("gen_throughput")
    return ServerEntry(
        url=t.url,
        state=state,
        detail=detail,
        model=t.model or (t.info or {}).get("model"),
        info=ServerInfo(**t.info) if t.info else None,
        reachable=t.reachable,
        liveness_endpoint=t.liveness_endpoint,
        last_seen_ts=t.last_seen_ts,
        connects_total=t.connects_total,
        metrics_enabled=t.metrics_enabled,
        metrics_error=t.metrics_error,
        health=Health(
            ok=t.health_ok,
            latency_s=t.health_latency_s,
            error=t.health_error,
            last_ts=t.health_last_ts,
            last_ok_ts=t.health_last_ok_ts,
            in_flight_s=age(now, t.health_in_flight_since),
            checks_total=t.health_checks_total,
            failures_total=t.health_failures_total,
            failures_in_row=t.health_failures_in_row,
            unanswered_s=age(now, t.health_unanswered_since),
            sglang_timeout_s=timeout[0] if timeout else None,
            sglang_timeout_source=timeout[1] if timeout else None,
        ),
        last_forward_ts=t.last_forward_ts,
        capture=t.capture,
        load=Load(
            running=load.get("running"),
            queued=load.get("queued"),
            token_usage=load.get("token_usage"),
            gen_tokens_per_s=gauge if gauge else t.gen_rate.rate() if load else None,
            prompt_tokens_per_s=t.prompt_rate.rate() if load else None,
        ),
        speculative=speculative_of(t.drafting, load, t.spec_estimate),
    )

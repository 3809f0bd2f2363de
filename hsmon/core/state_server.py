"""The server state machine: a pure function of one server's measurements (hsmon/core/trackers/server.py
measures; this decides; no I/O, no clock, no threads).

``down`` needs a refused connection, or a front that accepted but did not answer for
``--health-timeout`` seconds (a slow front on a loaded machine is ``busy`` until then).
``hung`` needs evidence that no forward completed for ``--health-timeout`` seconds while hsmon kept
asking: a ``/health_generate`` unanswered (failed or pending) since then, and no other sign of
forward progress since then either (a ``/health_generate`` that succeeded, the server's ``/metrics``
counters of prompt or generation tokens or finished requests moving, the job's own rows arriving).
A failed ``/health_generate`` alone is one fact, not a verdict: SGLang answers 503 by itself after
its own timeout (``SGLANG_HEALTH_CHECK_TIMEOUT``, 20 s by default) when one forward runs longer,
so a long prefill reads ``busy`` until ``--health-timeout`` passes with nothing moving.
"""

from __future__ import annotations

from dataclasses import dataclass

SERVER_STATES = ("up", "busy", "hung", "down", "unknown")


@dataclass(frozen=True)
class ServerLook:
    """What the server tracker measured, at ``now`` (times are epoch seconds; None: never)."""

    now: float
    health_timeout: float  # hsmon's --health-timeout: no forward for this long reads hung
    busy_after: float  # a forward slower than this reads busy
    looked: bool = False
    reachable: bool = False
    not_sglang: bool = False
    front_error: str | None = None
    front_unanswered_since: float | None = None  # the liveness looks time out (no refusal) since
    front_timeouts: int = 0
    health_in_flight_since: float | None = None  # a /health_generate is pending since
    health_ok: bool | None = None  # the last /health_generate that came back
    health_latency_s: float | None = None
    health_error: str | None = None  # "HTTP 503", "timed out", ...
    unanswered_since: float | None = None  # start of the first check since the last success not answered
    failures_in_row: int = 0  # /health_generate failures since the last success
    last_ok_ts: float | None = None  # the last /health_generate that succeeded
    counters_moved_ts: float | None = None  # /metrics counters (tokens, finished requests) last moved
    counters_moved: str | None = None  # which: "prompt tokens", "generation tokens", ...
    counters_read: bool = False  # /metrics counters are read at all (else "frozen" means nothing)
    job_progress_ts: float | None = None  # the job's rows last arrived (a job of this one server)
    sglang_timeout_s: float | None = None  # SGLang's own SGLANG_HEALTH_CHECK_TIMEOUT, when known
    running: float | None = None
    queued: float | None = None


def _ago(now: float, ts: float) -> str:
    return f"{max(0.0, now - ts):.0f} s ago"


def last_progress_ts(look: ServerLook) -> float | None:
    """When a forward was last seen completing, by any sign."""
    times = [t for t in (look.last_ok_ts, look.counters_moved_ts, look.job_progress_ts) if t is not None]
    return max(times) if times else None


def _moved(look: ServerLook, since: float) -> str:
    """What moved since ``since`` (the first unanswered check), latest sign first."""
    now = look.now
    signs = []
    if look.counters_moved_ts is not None and look.counters_moved_ts >= since:
        what = look.counters_moved or "counters"
        signs.append((look.counters_moved_ts, f"{what} moved {_ago(now, look.counters_moved_ts)}"))
    if look.job_progress_ts is not None and look.job_progress_ts >= since:
        signs.append((look.job_progress_ts, f"the job's rows arrived {_ago(now, look.job_progress_ts)}"))
    if signs:
        return max(signs)[1]
    if not look.counters_read:
        return "no /metrics counters to see progress by"
    # frozen since they last moved, or (never seen moving) at least since the first unanswered check
    frozen = look.counters_moved_ts if look.counters_moved_ts is not None else since
    return f"counters frozen for {max(0.0, now - frozen):.0f} s"


def _checks(look: ServerLook, in_flight: float | None) -> str:
    """The health checks' story since the last success: "/health_generate 503 ×4", SGLang's timeout."""
    parts = []
    if look.failures_in_row and look.health_error:
        error = look.health_error.replace("HTTP ", "")
        parts.append(f"/health_generate {error} ×{look.failures_in_row}")
        latency = look.health_latency_s
        if look.health_error == "HTTP 503" and latency is not None and latency >= 1.0:
            parts.append(f"SGLang's health check gave up at {latency:.0f} s")
        elif look.health_error == "HTTP 503" and look.sglang_timeout_s is not None:
            parts.append(f"answered at once; SGLang's own timeout is {look.sglang_timeout_s:g} s")
    if in_flight is not None and in_flight >= 1.0:
        parts.append(f"one pending {in_flight:.0f} s")
    return "; ".join(parts) or "/health_generate unanswered"


def _load(look: ServerLook) -> str:
    if look.running is None and look.queued is None:
        return ""
    return f"; queue {look.queued or 0:.0f}, running {look.running or 0:.0f}"


def decide_server(look: ServerLook) -> tuple[str, str]:
    """(state, one-line detail that says what was seen); pure."""
    if not look.looked:
        return "unknown", "not looked at yet"
    if look.front_unanswered_since is not None:
        # it accepts connections but does not answer: slow or frozen, down once that lasts
        silent = max(0.0, look.now - look.front_unanswered_since)
        seen = f"{look.front_error or 'timed out'} ×{look.front_timeouts}"
        if silent > look.health_timeout:
            return (
                "down",
                f"the HTTP front has not answered for {silent:.0f} s ({seen}; --health-timeout "
                f"{look.health_timeout:g} s)",
            )
        return (
            "busy",
            f"the HTTP front is slow: no answer for {silent:.0f} s ({seen}); down after "
            f"{look.health_timeout:g} s without one",
        )
    if not look.reachable:
        return "down", look.front_error or "no answer"
    if look.not_sglang:
        return "unknown", ("answers HTTP but is not an SGLang or vLLM server (no /metrics, /model_info, "
                           "/v1/models)")
    now = look.now
    in_flight = None if look.health_in_flight_since is None else max(0.0, now - look.health_in_flight_since)
    if look.unanswered_since is not None:
        progress = last_progress_ts(look)
        asking_since = max(look.unanswered_since, progress or look.unanswered_since)
        silent = now - asking_since
        if silent > look.health_timeout:
            since = progress if progress is not None else look.unanswered_since
            frozen = "counters frozen" if look.counters_read else "no /metrics counters"
            return "hung", (
                f"no forward completed in {now - since:.0f} s (--health-timeout {look.health_timeout:g} s); "
                f"{_checks(look, in_flight)}{_load(look)}, {frozen}"
            )
        failing = look.health_ok is False or (in_flight is not None and in_flight > look.busy_after)
        if failing:
            ran, moved = now - look.unanswered_since, _moved(look, look.unanswered_since)
            return "busy", (
                f"one forward has run {ran:.0f} s ({_checks(look, in_flight)}; {moved})"
                f"{_load(look)}; hung after {look.health_timeout:g} s with nothing moving"
            )
    if look.health_ok and look.health_latency_s is not None and look.health_latency_s > look.busy_after:
        return "busy", f"/health_generate took {look.health_latency_s:.1f} s"
    if look.health_ok is None:
        return "up", "the HTTP front answers; no forward checked yet"
    return "up", f"/health_generate answered in {look.health_latency_s or 0:.1f} s"

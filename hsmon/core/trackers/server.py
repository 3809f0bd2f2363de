"""Server tracker: is the inference server a job talks to up, busy, hung or down, and how loaded.
SGLang's and vLLM's: what differs between the engines is in server_engines.py (vLLM: no /server_info,
its forward a one-token /v1/completions).

Each server is looked at by two threads of its own, never by a scrape:
- liveness and load, every ``interval``: ``/metrics`` (with ``--enable-metrics``), else
  ``/model_info``, else ``/v1/models``: these answer without the scheduler (the front is there);
- a real forward, every ``health_interval``: ``/health_generate`` (SGLang answers 503 after its
  own ``SGLANG_HEALTH_CHECK_TIMEOUT``, 20 s by default), one in flight at most; ``/server_info``
  and SGLang's own timeout (a local server's environment) once per connect, on the same thread;
  ``/server_info`` again after each check that succeeded, for the capture plugin's counters
  (``server_capture.py``), on a short-lived thread of its own (3 s timeout, one at a time): the
  forward thread never waits for it.

The states and their evidence are decided by hsmon/core/state_server.py (``decide_server``); the
threads here only measure.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from hsmon.core.config import ServerSpec
from hsmon.core.state_facts import ServerFacts
from hsmon.core.trackers.rates import RateWindow
from hsmon.core.trackers.server_capture import parse_capture
from hsmon.core.trackers.server_engines import VLLM, discard_files, read_vllm, vllm_forward
from hsmon.core.trackers.server_http import Unreachable, http_get, sglang_timeout_of
from hsmon.core.trackers.server_rules import (
    COUNTERS,
    SERVER_STATES,
    decide_server,
    decode_moved,
    info_of,
    parse_load,
)
from hsmon.core.trackers.server_section import entry_of, look_of
from hsmon.core.trackers.server_spec import drafter_estimate, spec_info
from hsmon.status_doc import Capture, ServerEntry

__all__ = ["SERVER_STATES", "ServerTracker", "parse_load"]

log = logging.getLogger("hsmon.server")

LIVENESS_TIMEOUT = 3.0
LIVENESS_ENDPOINTS = ("/metrics", "/model_info", "/v1/models")


class ServerTracker:
    """One server, watched by its own threads; ``snapshot`` and ``facts`` read memory only."""

    def __init__(self, spec: ServerSpec, now: float | None = None) -> None:
        self.spec = spec
        self.url = spec.url
        self.watch_start_ts = time.time() if now is None else now
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._connected = threading.Event()  # wakes the forward thread at (re)connect
        self._threads: list[threading.Thread] = []
        self.looked = False
        self.reachable = False
        self.not_sglang = False
        self.front_error: str | None = None
        self.front_unanswered_since: float | None = None  # liveness looks time out since
        self.front_timeouts = 0
        self.liveness_endpoint: str | None = None
        self.metrics_enabled: bool | None = None
        self.metrics_error: str | None = None
        self.last_seen_ts: float | None = None
        self.connects_total = 0
        self.model: str | None = None
        self.info: dict[str, Any] | None = None
        self.capture: Capture | None = None  # the capture plugin's counters (None: no plugin)
        self.drafting: dict[str, Any] | None = None  # speculative decoding, from /server_info (None: none)
        self.spec_estimate: tuple[float | None, str | None] = (None, None)  # the drafter's own
        self._need_info = False
        self.engine: str | None = None  # "vllm" once known (server_engines.py); SGLang otherwise
        self._health_files: list[str] = []  # a vLLM capture server's files of our checks, to remove
        self._info_in_flight = False  # a /server_info read for the capture counters is out
        self.load: dict[str, float] = {}
        self.gen_rate = RateWindow(30.0)
        self.prompt_rate = RateWindow(30.0)
        self._counters: tuple[float | None, ...] | None = None
        self.last_counters_moved_ts: float | None = None
        self.counters_moved: str | None = None  # which counter moved last (words for a reason)
        self.decode_moved_ts: float | None = None  # answers decoded (server_rules.decode_moved)
        self.job_progress_ts: float | None = None  # the job's rows arrived (set by the job's tick)
        self.sglang_timeout: tuple[float, str] | None = None  # SGLang's own timeout, and how known
        self._timeout_looked = False
        self.health_in_flight_since: float | None = None
        self.health_ok: bool | None = None
        self.health_latency_s: float | None = None
        self.health_error: str | None = None
        self.health_last_ts: float | None = None
        self.health_last_ok_ts: float | None = None
        self.health_checks_total = 0
        self.health_failures_total = 0
        self.health_failures_in_row = 0
        self.health_unanswered_since: float | None = None
        self._logged_state: str | None = None

    # -- threads --------------------------------------------------------------------------------
    def start(self) -> None:
        if self._threads:
            return
        for target, name in ((self._liveness_loop, "live"), (self._forward_loop, "forward")):
            thread = threading.Thread(target=target, name=f"hsmon-server-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    @property
    def started(self) -> bool:
        return bool(self._threads)

    def stop(self) -> None:
        self._stop.set()
        self._connected.set()
        for thread in self._threads:
            thread.join(timeout=0.2)  # a forward in flight ends at its own timeout (daemon thread)

    def _liveness_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.look()
            except Exception:  # a bug here must not end the watch
                log.exception("server %s: liveness check failed", self.url)
            self._stop.wait(self.spec.interval)

    def _forward_loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                ready = self.reachable and not self.not_sglang
            if not ready:
                self._connected.wait(self.spec.interval)
                self._connected.clear()
                continue
            try:
                self.check_forward()
            except Exception:
                log.exception("server %s: forward check failed", self.url)
            self._stop.wait(self.spec.health_interval)

    # -- measuring (one call each; the threads repeat them) --------------------------------------
    def look(self) -> None:
        """Liveness and load of the HTTP front: one cheap request (two when discovering endpoints)."""
        endpoints = [self.liveness_endpoint] if self.liveness_endpoint else list(LIVENESS_ENDPOINTS)
        if self.metrics_enabled is False and "/metrics" in endpoints:
            endpoints.remove("/metrics")
        status, body, used, error = None, b"", None, None
        started = time.time()
        for path in endpoints:
            try:
                status, body = http_get(self.url + path, LIVENESS_TIMEOUT)
            except Unreachable as exc:
                error = str(exc)
                break
            if status == 200:
                used = path
                break
            if path == "/metrics" and status == 404:
                self.metrics_enabled = False
        now = time.time()
        with self._lock:
            self.looked = True
            if error is not None and "timed out" in error:
                # a front that accepts but does not answer: slow (a loaded machine) or frozen; down
                # only once it stays so for --health-timeout (the rule), and its state is kept
                if self.front_unanswered_since is None:
                    self.front_unanswered_since = started
                self.front_timeouts += 1
                self.front_error = error
                self._log_state(now)
                return
            self.front_unanswered_since, self.front_timeouts = None, 0
            if error is not None:
                if self.reachable:
                    self._disconnect()
                self.reachable, self.front_error = False, error
                self._log_state(now)
                return
            connect = not self.reachable
            self.reachable, self.front_error, self.last_seen_ts = True, None, now
            if used is None:
                if self.liveness_endpoint is not None:  # it answered before: look afresh next time
                    self.liveness_endpoint = None
                    self.metrics_enabled = None
                else:
                    self.not_sglang = True
                self._log_state(now)
                return
            self.not_sglang = False
            self.liveness_endpoint = used
            if connect:
                self.connects_total += 1
                self._need_info = True
            if used == "/metrics":
                self.metrics_enabled = True
                self._apply_metrics(now, body)
        if connect:
            self._read_model()
            self._connected.set()
        with self._lock:
            self._log_state(now)

    def _disconnect(self) -> None:
        """Forget what belonged to the previous process: a restarted server is checked afresh."""
        self.health_ok = self.health_latency_s = self.health_error = None
        self.health_unanswered_since, self.health_failures_in_row = None, 0
        self.sglang_timeout, self._timeout_looked = None, False
        self.liveness_endpoint = None
        self.metrics_enabled = None
        self.load = {}
        self._counters = None
        self.capture = None  # a restarted server's counters start again
        self.engine = None  # and it may be another engine
        self.drafting, self.spec_estimate = None, (None, None)  # and it may serve another drafter

    def record_metrics(self, now: float, body: bytes) -> None:
        """A /metrics answer read at ``now`` (what ``look`` does with one; for replays)."""
        with self._lock:
            self.looked = self.reachable = True
            self.metrics_enabled = True
            self._apply_metrics(now, body)

    def _apply_metrics(self, now: float, body: bytes) -> None:
        try:
            load = parse_load(body.decode("utf-8", "replace"))
        except (ValueError, UnicodeDecodeError) as exc:
            self.metrics_error = f"/metrics is not Prometheus text ({exc})"[:200]
            self.load = {}
            return
        self.metrics_error = None
        if decode_moved(self.load, load):
            self.decode_moved_ts = now  # answers decoding: a regeneration's work (job_activity.py)
        self.load = load
        gen, prompt = load.get("generation_tokens_total"), load.get("prompt_tokens_total")
        if gen is not None:
            self.gen_rate.add(now, gen)
        if prompt is not None:
            self.prompt_rate.add(now, prompt)
        counters = tuple(load.get(field) for field, _ in COUNTERS)
        if self._counters is not None:
            pairs = zip(COUNTERS, self._counters, counters, strict=True)
            moved = [words for (_, words), a, b in pairs if a != b]
            if moved:  # forwards completed since the last look
                self.last_counters_moved_ts, self.counters_moved = now, moved[0]
        self._counters = counters

    def _read_model(self) -> None:
        try:
            status, body = http_get(self.url + "/model_info", LIVENESS_TIMEOUT)
            data = json.loads(body) if status == 200 else {}
        except (Unreachable, ValueError):
            return
        if isinstance(data, dict) and isinstance(data.get("model_path"), str):
            with self._lock:
                self.model = data["model_path"]

    def check_forward(self) -> None:
        """Server info once per connect, then one /health_generate; its latency is recorded; after
        a health check that succeeded, /server_info again for the capture plugin's counters."""
        timeout = self.spec.health_timeout
        if self._need_info:
            self._read_server_info(timeout)
        if self.engine == VLLM:
            self.health_started(time.time())
            mono = time.monotonic()
            ok, error, path = vllm_forward(self.url, str(self.model or ""), timeout)
            self.health_done(time.time(), ok, time.monotonic() - mono, error)
            self._health_files = discard_files(self._health_files + ([path] if path else []))
            return
        if not self._timeout_looked:
            found = sglang_timeout_of(self.url)
            with self._lock:
                self._timeout_looked, self.sglang_timeout = True, found
        mono = time.monotonic()
        self.health_started(time.time())
        ok, error = False, None
        try:
            status, _ = http_get(self.url + "/health_generate", timeout)
            ok = status == 200
            error = None if ok else f"HTTP {status}"
        except Unreachable as exc:
            error = "timed out" if "timed out" in str(exc) else str(exc)
        self.health_done(time.time(), ok, time.monotonic() - mono, error)
        if ok and not self._info_in_flight:
            # the capture counters, on a thread of their own: a scheduler that stops right now
            # must not delay the next check (and so the hung verdict) by this read's timeout
            self._info_in_flight = True
            threading.Thread(target=self._refresh_info, name="hsmon-server-info", daemon=True).start()

    def _refresh_info(self) -> None:
        try:
            self._read_server_info(LIVENESS_TIMEOUT)
        finally:
            self._info_in_flight = False

    def _read_server_info(self, timeout: float) -> None:
        """``/server_info``: the server's facts (``info``) and the capture plugin's counters (vLLM, which
        has none: ``/v1/models`` and its launch's speculative decoding, once per connect)."""
        if self.engine == VLLM:
            return
        try:
            status, body = http_get(self.url + "/server_info", timeout)
            data = json.loads(body) if status == 200 else None
        except (Unreachable, ValueError):
            data = None
        if not isinstance(data, dict):
            found = read_vllm(self.url, timeout) if self._need_info else None
            if found is not None:
                with self._lock:
                    self.engine = VLLM
                    self.model, self.info = found.model, info_of(found.info)
                    self.drafting, self.spec_estimate = found.drafting, found.estimate
                    self._need_info = False
            return  # unanswered: the last counters stay, their read_ts says how old they are
        capture = parse_capture(data, time.time())
        spec = spec_info(data)
        estimate = self.spec_estimate
        if spec is not None and (self.drafting or {}).get("draft_model") != spec["draft_model"]:
            estimate = drafter_estimate(spec["draft_model"], spec["depth"])  # once per drafter
        with self._lock:
            self.drafting, self.spec_estimate = spec, estimate
            self._need_info = False
            self.capture = capture
            self.info = info_of(data)

    def health_started(self, now: float) -> None:
        """A /health_generate went out at ``now``."""
        with self._lock:
            self.health_in_flight_since = now
            if self.health_unanswered_since is None:
                self.health_unanswered_since = now

    def health_done(self, now: float, ok: bool, latency: float, error: str | None) -> None:
        """The /health_generate in flight came back at ``now`` (``error``: "HTTP 503", "timed out"...)."""
        with self._lock:
            self.health_in_flight_since = None
            self.health_checks_total += 1
            self.health_last_ts = now
            if error == "HTTP 404":
                self.not_sglang = True  # a front without /health_generate: not a server we can check
            elif ok:
                self.health_ok, self.health_latency_s, self.health_error = True, latency, None
                self.health_last_ok_ts = now
                self.health_unanswered_since, self.health_failures_in_row = None, 0
            else:
                self.health_failures_total += 1
                self.health_failures_in_row += 1
                self.health_ok, self.health_latency_s, self.health_error = False, latency, error
                if error == "HTTP 503" and latency >= 1.0 and self.sglang_timeout is None:
                    # SGLang gave up by itself: its timeout, to the second (it looks once a second)
                    self.sglang_timeout = (float(round(latency)), f"measured: a 503 after {latency:.1f} s")
            self._log_state(now)

    # -- reading --------------------------------------------------------------------------------
    @property
    def counters_read(self) -> bool:
        """Whether /metrics gave any of the forward counters (server_rules.COUNTERS)."""
        return any(v is not None for v in self._counters or ())

    def _state(self, now: float) -> tuple[str, str]:
        return decide_server(look_of(self, now))

    def note_job_progress(self, ts: float | None) -> None:
        """The job's rows last arrived at ``ts``: a sign of forward progress (a job of one server)."""
        with self._lock:
            self.job_progress_ts = ts

    def _log_state(self, now: float) -> None:
        """One log line per change of state (a down server does not log every interval)."""
        state, detail = self._state(now)
        if state == self._logged_state:
            return
        self._logged_state = state
        level = logging.WARNING if state in ("hung", "down") else logging.INFO
        log.log(level, "server %s is %s: %s", self.url, state, detail)
        if state == "up" and self.metrics_enabled is False:
            log.info("server %s runs without --enable-metrics: no load figures", self.url)

    @property
    def last_forward_ts(self) -> float | None:
        """When a forward last completed: a health_generate answered, counters moved, the job's rows came."""
        times = [t for t in (self.health_last_ok_ts, self.last_counters_moved_ts, self.job_progress_ts) if t]
        return max(times) if times else None

    def facts(self, now: float) -> ServerFacts:
        with self._lock:
            state, detail = self._state(now)
            return ServerFacts(self.url, state, detail, self.last_forward_ts, self.watch_start_ts,
                               self.decode_moved_ts)

    def snapshot(self, now: float) -> ServerEntry:
        """The ``servers[]`` entry of the status document."""
        with self._lock:
            state, detail = self._state(now)
            return entry_of(self, now, state, detail)

"""The servers behind ``--url``: which one takes the next request, retries with backoff and
jitter, and the ``pause``/``resume`` events (reason ``server``) while none of them answers.

Pure bookkeeping plus events; the HTTP calls are made by the caller. Retried: timeouts, refused
or broken connections, HTTP 5xx. Given up: after ``give_up_s`` seconds in which every attempt
on every server failed (the clock restarts with any success).
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from typing import Any

from extractor.backends.base import BackendStopped
from hsmon.contracts import events as ev
from hsmon.contracts.pauses import Pause


class GiveUp(RuntimeError):
    """Every server failed for longer than the configured time."""


class Stopped(BackendStopped):
    """A stop was requested while waiting for a server or for room in the dump directory."""


class RetryableError(Exception):
    """A failure worth retrying on the same or another server (timeout, connection, 5xx)."""


@dataclass
class _State:
    in_flight: int = 0
    served: int = 0
    down_since: float | None = None
    last_error: str = ""
    last_retry_event: float = 0.0
    max_input: int | None = None  # the longest row it accepts (preflight), None: unknown


BACKOFF_CAP_S = 5.0


def backoff_delay(attempt: int, base: float = 0.25, cap: float = BACKOFF_CAP_S,
                  rng: random.Random | None = None) -> float:
    """Exponential backoff with jitter: ``min(cap, base * 2**attempt)`` scaled by a random 0.5..1."""
    scale = (rng or random).uniform(0.5, 1.0)
    return min(cap, base * (2 ** min(attempt, 30))) * scale


class ServerPool:
    """Spreads requests over the servers by load (fewest in flight, up servers first)."""

    def __init__(self, urls: list[str], events: Any, progress: Any, stop_event: threading.Event,
                 give_up_s: float = 600.0, max_input: dict[str, int | None] | None = None) -> None:
        self.urls = list(urls)
        self.events, self.progress, self.stop_event = events, progress, stop_event
        self.give_up_s = give_up_s
        self._state = {url: _State(max_input=(max_input or {}).get(url)) for url in self.urls}
        self._lock = threading.Lock()
        self._failing_since: float | None = None
        self._pause = Pause("server", events, progress)
        self.retries = 0

    def acquire(self, length: int = 0) -> str:
        """The URL for the next attempt of a ``length``-token row (counted in flight until
        ``release``): among the servers that accept rows that long, an up one with the fewest
        requests in flight."""
        with self._lock:
            fits = [u for u in self.urls if (self._state[u].max_input or length) >= length] or self.urls
            up = [u for u in fits if self._state[u].down_since is None]
            url = min(up or fits, key=lambda u: self._state[u].in_flight)
            self._state[url].in_flight += 1
            return url

    def served(self) -> dict[str, int]:
        """Requests answered per server."""
        with self._lock:
            return {url: state.served for url, state in self._state.items()}

    def release(self, url: str) -> None:
        with self._lock:
            self._state[url].in_flight -= 1

    def succeeded(self, url: str) -> None:
        """A request on ``url`` worked: the server is up; resume if the run was paused."""
        with self._lock:  # held while resuming: a pause decided meanwhile would outlive this success
            state = self._state[url]
            state.down_since = None
            state.served += 1
            self._failing_since = None
            self._pause.end(f"{url} answers", url=url)

    def row_failed(self, url: str, row: int, error: str, attempt: int) -> None:
        """One row failed on a server that answers other requests: a ``retry`` event (reason
        ``row``), the server is not marked down."""
        with self._lock:
            self.retries += 1
            retries = self.retries
        self.events.emit(ev.RETRY, reason="row", url=url, row=row, error=error, attempt=attempt,
                         retries=retries)

    def failed(self, url: str, error: str) -> None:
        """A retryable failure on ``url``; pauses when no server is up; GiveUp after ``give_up_s``."""
        now = time.monotonic()
        emit_retry = False
        with self._lock:
            self.retries += 1
            state = self._state[url]
            state.last_error = error
            if state.down_since is None:
                state.down_since = now
            if self._failing_since is None:
                self._failing_since = now
            failing = now - self._failing_since
            if now - state.last_retry_event >= 1.0:
                state.last_retry_event, emit_retry = now, True
            retries = self.retries
        if emit_retry:
            self.events.emit(ev.RETRY, reason="server", url=url, error=error, retries=retries)
        with self._lock:  # decided and begun under the lock: a success cannot slip in between
            down = [u for u, s in self._state.items() if s.down_since is not None]
            if len(down) == len(self._state):
                self._pause.begin(f"no SGLang server answers ({', '.join(down)}; last: {error})",
                                  f"one to answer (gives up after {self.give_up_s:g}s without any)",
                                  f"with backoff, at most every {BACKOFF_CAP_S:g}s",
                                  url=url, urls=down, error=error)
        if failing > self.give_up_s:
            raise GiveUp(f"no SGLang server answered for {failing:.0f} s (last: {url}: {error}); check the "
                         f"server(s), then run the same command to resume (--give-up-after sets this limit)")

    def wait(self, seconds: float) -> None:
        """Sleep for a backoff delay; Stopped when a stop is requested meanwhile."""
        if self.stop_event.wait(seconds):
            raise Stopped

"""One row's requests over the server pool, for every client of SGLang's ``/generate`` (`hsmon
extract --backend sglang`, `hsmon regenerate --backend sglang`): the attempts with backoff, the
control request that tells a row's own failure from its server's, and the row's rejection.

A failure (timeout, connection, HTTP 5xx, 408, 429) is the server's unless a control request (the
row's first few tokens) goes through on the same server: then it is the row's, and the row is
rejected after ``row_attempts`` of them. A refusal (another 4xx) rejects the row when the control
goes through, stops the run when the control is refused too (the server refuses everything), and
is the server's failure when the control cannot reach it. The server's failures pause the run and
give up after the pool's limit (extractor/backends/sglang/pool.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import requests

from extractor.backends.base import RowRejected
from extractor.backends.sglang import transports
from extractor.backends.sglang.pool import RetryableError, ServerPool, Stopped, backoff_delay
from hsmon.contracts.rejects import SERVER_FAILING, SERVER_REFUSED

RETRYABLE_STATUS = (408, 429)  # and every 5xx
PROBE_TOKENS = 8  # the control request: this many first tokens of the failing row

T = TypeVar("T")


class RefusedError(Exception):
    """An HTTP 4xx for one request: the server's own words in ``message``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message = status, message


class AttemptAgain(Exception):
    """The server answered but the row must be sent again (the answer's file never came, room ran
    out). ``judge``: ask the control request whether the server serves: if it does, the attempt is
    a strike against the row (RuntimeError after ``row_attempts``); if not, the server's failure."""

    def __init__(self, message: str, judge: bool) -> None:
        super().__init__(message)
        self.judge = judge


def post_generate(session: requests.Session, url: str, body: dict[str, Any], timeout: float,
                  path: str = "/generate", headers: dict[str, str] | None = None) -> bytes:
    """One /generate call (vLLM's client: ``path`` /v1/completions); RetryableError for what another
    attempt may fix (timeouts, connections, 5xx, 408, 429), RefusedError for any other refusal (4xx)."""
    try:
        resp = session.post(url + path, json=body, timeout=timeout, headers=headers)
    except (requests.ConnectionError, requests.Timeout) as exc:
        raise RetryableError(f"{type(exc).__name__}: {str(exc)[:200]}") from None
    if resp.status_code >= 500 or resp.status_code in RETRYABLE_STATUS:
        raise RetryableError(f"HTTP {resp.status_code}: {resp.text[:200]}")
    if resp.status_code != 200:
        raise RefusedError(resp.status_code, transports.server_message(resp.status_code, resp.text))
    return resp.content


def probe_ids(ids: list[int]) -> list[int]:
    """The control request's tokens: the row's first few (half of a short row)."""
    return ids[: max(1, min(PROBE_TOKENS, len(ids) // 2))]


def judge(control: Callable[[], Any]) -> str:
    """What a control request says of its server: "serves", "refuses" (an HTTP 4xx to that too: the
    server refuses everything) or "down"."""
    try:
        control()
    except RefusedError:
        return "refuses"
    except RetryableError:
        return "down"
    return "serves"


def request_row(pool: ServerPool, row: int, length: int, post: Callable[[str], bytes],
                finish: Callable[[bytes, str], T], evidence: Callable[[str], str], row_attempts: int,
                before: Callable[[], None] | None = None) -> T | RowRejected:
    """Send one row until it is answered (``finish(body, url)``'s result) or rejected.

    ``post(url)`` makes the request (RetryableError, RefusedError); ``finish`` reads the answer (may
    raise AttemptAgain); ``evidence(url)`` is the control request's verdict (`judge`); ``before``
    waits for room before each attempt. Stopped when a stop is requested meanwhile.
    """
    attempt = strikes = 0
    while True:
        if pool.stop_event.is_set():
            raise Stopped
        if before is not None:
            before()
        url = pool.acquire(length)
        try:
            body = post(url)
        except RetryableError as exc:
            pool.release(url)
            if evidence(url) != "serves":
                pool.failed(url, str(exc))  # the server's failure, not the row's: pause rules
            else:  # a poison row: it fails where other requests go through
                strikes += 1
                if strikes >= row_attempts:
                    return RowRejected(f"{SERVER_FAILING} {strikes} times while it answered other "
                                       f"requests (last: {url}: {exc})")
                pool.row_failed(url, row, str(exc), strikes)
        except RefusedError as exc:
            pool.release(url)
            verdict = evidence(url)
            if verdict == "serves":
                return RowRejected(f"{SERVER_REFUSED} (HTTP {exc.status} from {url}): {exc.message}")
            if verdict == "refuses":
                raise RuntimeError(f"row {row}: {url}/generate answered HTTP {exc.status}: {exc.message}; "
                                   "a short control request is refused too, so the server refuses every "
                                   "request: fix it, then run the same command") from None
            pool.failed(url, str(exc))
        else:
            pool.release(url)
            pool.succeeded(url)
            try:
                return finish(body, url)
            except AttemptAgain as exc:
                if exc.judge:
                    if evidence(url) != "serves":
                        pool.failed(url, str(exc))
                    else:
                        strikes += 1
                        if strikes >= row_attempts:
                            raise RuntimeError(f"row {row}: {exc}") from None
        pool.wait(backoff_delay(attempt))
        attempt += 1

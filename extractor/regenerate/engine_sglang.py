"""Answers from SGLang servers: one ``/generate`` call per answer (the prompt's token ids, the run's
sampling, the answer's seed), over the same pool as `hsmon extract --backend sglang`: the least
loaded server first, retries with backoff, a pause while none answers, a give-up after
``--give-up-after`` (extractor/backends/sglang/pool.py, attempts.py). A server that refuses a row
makes that row a reject.

Seeded sampling is reproducible only on a server started with ``--enable-deterministic-inference``
(SGLang honours ``sampling_seed`` only there); greedy is reproducible on any.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any

import requests

from extractor.backends.base import RowRejected, RunContext
from extractor.backends.sglang import preflight
from extractor.backends.sglang.attempts import judge, post_generate, probe_ids, request_row
from extractor.backends.sglang.options import SGLangOptions
from extractor.backends.sglang.pool import ServerPool
from extractor.regenerate.engines import Answer, Sampling

PER_SERVER_DEFAULT = 32  # requests in flight per server when its info gives no limit


class SGLangEngine:
    """Answers from the servers of ``--url``."""

    name = "sglang"

    def __init__(self, options: SGLangOptions, sampling: Sampling, context: RunContext,
                 max_positions: int) -> None:
        self.options, self.sampling = options, sampling
        self.facts = [preflight.facts_of(url, preflight.wait_for_info(url, min(options.request_timeout, 30.0),
                                                                      options.wait_for_server))
                      for url in options.urls]
        self.deterministic = all(bool(f.raw.get("enable_deterministic_inference")) for f in self.facts)
        contexts = [f.context_length for f in self.facts if f.context_length]
        self.max_positions = min([*contexts, max_positions])
        self.concurrency = options.concurrency or default_concurrency(self.facts, sampling.max_new_tokens)
        self.pool = ServerPool(options.urls, context.events, context.progress, context.stop_event,
                               give_up_s=options.give_up_after)
        self._nonce = os.urandom(4).hex()
        self._count = 0
        self._lock = threading.Lock()
        self._in_flight: dict[str, str] = {}  # rid -> url: what a stop aborts on the servers
        self._local = threading.local()
        for fact in self.facts:
            print(f"hsmon regenerate: {fact.url}: SGLang {fact.raw.get('version') or 'unknown'}, model "
                  f"{fact.model_path}", file=sys.stderr, flush=True)

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        return session

    def _rid(self, row: int, kind: str = "r") -> str:
        with self._lock:
            self._count += 1
            return f"regen-{kind}{row}-{self._nonce}-{self._count}"

    def _body(self, rid: str, ids: list[int], seed: int, max_new_tokens: int) -> dict[str, Any]:
        s = self.sampling
        params: dict[str, Any] = {"max_new_tokens": max_new_tokens, "temperature": s.temperature,
                                  "top_p": s.top_p, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0,
                                  "stop_token_ids": list(s.stop_ids)}
        if not s.greedy:
            params["sampling_seed"] = seed
        return {"rid": rid, "input_ids": ids, "sampling_params": params}

    def generate(self, prompt: list[int], seed: int, row: int) -> Answer | RowRejected:
        """The answer to ``prompt`` (RowRejected: a server refused it, or failed on it alone)."""
        timeout = self.options.request_timeout

        def post(url: str) -> bytes:
            rid = self._rid(row)
            with self._lock:
                self._in_flight[rid] = url
            try:
                return post_generate(self._session(), url, self._body(rid, prompt, seed,
                                                                      self.sampling.max_new_tokens), timeout)
            finally:
                with self._lock:
                    self._in_flight.pop(rid, None)

        def evidence(url: str) -> str:
            body = self._body(self._rid(row, "probe"), probe_ids(prompt), seed, 1)
            return judge(lambda: post_generate(self._session(), url, body, min(timeout, 60.0)))

        return request_row(self.pool, row, len(prompt) + self.sampling.max_new_tokens, post, self._answer,
                           evidence, self.options.row_attempts)

    def _answer(self, body: bytes, url: str) -> Answer:
        try:
            payload = json.loads(body)
            ids = [int(i) for i in payload["output_ids"]]
            finish = (payload.get("meta_info") or {}).get("finish_reason") or {}
        except (ValueError, KeyError, TypeError) as exc:
            raise RuntimeError(f"{url}/generate answered no output_ids ({exc}): is it an SGLang "
                               "server?") from None
        kind = finish.get("type") if isinstance(finish, dict) else None
        return Answer(ids, "length" if kind == "length" else "stop")

    def describe(self) -> dict[str, Any]:
        """For the run's ``start`` event (the monitor watches these servers)."""
        return {"urls": list(self.options.urls), "concurrency": self.concurrency}

    def provenance(self) -> dict[str, Any]:
        versions = sorted({str(f.raw.get("version") or "unknown") for f in self.facts})
        return {"engine": "sglang", "release": ", ".join(versions), "urls": list(self.options.urls),
                "server_models": sorted({f.model_path for f in self.facts}),
                "dtype": sorted({f.dtype for f in self.facts}), "deterministic": self.deterministic}

    def close(self) -> None:
        """Abort the answers still in flight (a stop: their rows are drawn again on resume), so that
        the servers do not decode for nobody (SGLang's /abort_request, best effort)."""
        with self._lock:
            in_flight = dict(self._in_flight)
        for rid, url in in_flight.items():
            try:
                requests.post(url + "/abort_request", json={"rid": rid}, timeout=2.0)
            except requests.RequestException:
                continue


def default_concurrency(facts: list[Any], max_new_tokens: int) -> int:
    """Answers in flight over all servers: per server its running-request limit, or as many answers of
    twice --max-new-tokens as its KV cache holds, at most PER_SERVER_DEFAULT when it says neither."""
    total = 0
    for fact in facts:
        per = fact.max_running_requests or PER_SERVER_DEFAULT
        if fact.max_total_tokens:
            per = min(per, max(1, fact.max_total_tokens // max(1, 2 * max_new_tokens)))
        total += per
    return max(1, total)


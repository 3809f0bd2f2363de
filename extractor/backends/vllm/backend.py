"""The `vllm` backend: one /v1/completions request per row (one prompt per request: a request with
several prompts names only the first prompt's file), N in flight over one or more servers.

Everything but the request and its answer is the sglang client's (``SGLangBackend``): the pool that
spreads rows by load, retries with backoff, the ``server`` pause while no server answers and
``--give-up-after``, the control request that tells a row's failure from the server's (rejects), the
dump directory's backpressure (``shm`` pause). Here: the OpenAI-style request with ``max_tokens: 1``,
vLLM's connector file waited for, read, checked against the row's tokens and removed, and the last
layer finished with the model's own final norm (extractor/backends/vllm/final_norm.py).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from extractor.backends.base import ModelInfo, RowStates, RunContext
from extractor.backends.sglang.attempts import post_generate
from extractor.backends.sglang.backend import SGLangBackend
from extractor.backends.sglang.pool import ServerPool
from extractor.backends.sglang.preflight import default_concurrency
from extractor.backends.vllm import dumps, preflight
from extractor.backends.vllm.final_norm import load_final_norm
from extractor.backends.vllm.options import VLLMOptions

# tests only: each file's read waits this long, so that a test can kill a run or a server mid-run
# whatever the machine's speed (docs/development.md, "Signals mid-run")
READ_DELAY_ENV = "HSMON_VLLM_READ_DELAY_S"


class VLLMBackend(SGLangBackend):
    """Rows as /v1/completions requests to vLLM servers started by `hsmon vllm-serve`."""

    name = "vllm"

    def __init__(
        self,
        model_dir: str,
        capture_points: Sequence[int],
        info: ModelInfo,
        options: VLLMOptions,
        context: RunContext,
    ) -> None:
        self.capture_points = list(capture_points)
        self.info = info
        self.options = options
        self.transport = "vllm"
        self.torch_dtype = getattr(torch, info.dtype)
        self.facts = options.facts or preflight.check_servers(
            options.urls,
            self.capture_points,
            info.dtype,
            info.hidden_size,
            timeout=min(options.request_timeout, 30.0),
        )
        for facts in self.facts:
            print(f"hsmon extract: {preflight.release_line(facts)}", file=sys.stderr, flush=True)
        self._facts = {f.url: f for f in self.facts}
        self.norm = load_final_norm(model_dir)
        self.concurrency = options.concurrency or default_concurrency(self.facts, options.longest_row, "vllm")
        self._chunk_size = {f.url: -1 for f in self.facts}
        self.pool = ServerPool(
            options.urls,
            context.events,
            context.progress,
            context.stop_event,
            give_up_s=options.give_up_after,
            max_input={f.url: f.max_input for f in self.facts},
        )
        roots = sorted({f.dump_root for f in self.facts})
        self.dump = dumps.VLLMDumpDir(
            Path(roots[0]),
            options.tag,
            options.max_dump_bytes,
            options.dump_min_free,
            context.events,
            context.progress,
            context.stop_event,
        )
        self.dump.prepare()
        self._others = [
            dumps.VLLMDumpDir(Path(r), options.tag, 0, 0, None, None, context.stop_event) for r in roots[1:]
        ]  # servers with dump directories of their own: cleaned too
        for other in self._others:
            other.prepare()
        self._nonce = os.urandom(4).hex()
        self._attempts = self._probes = 0
        self._lock = threading.Lock()
        self._local = threading.local()
        self._row_ids = threading.local()
        self._read_delay = float(os.environ.get(READ_DELAY_ENV) or 0)
        self._executor = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="hsmon-vllm")
        self.stats = {"requests": 0, "orphans_reused": 0, "request_seconds": 0.0, "client_seconds": 0.0}

    def captured(self) -> dict[str, Any]:
        """For the manifest's ``run`` record: the points each server captures, by vLLM's rule."""
        return {
            "points": self.capture_points,
            "engine": "vllm",
            "servers": [
                {"url": f.url, "rule": "vllm", "layer_ids": f.layer_ids, "captured_points": f.captured_points}
                for f in self.facts
            ],
        }

    def describe(self) -> dict[str, Any]:
        """Fields for the run's ``start`` event (the daemon's engine watch reads ``urls``, ``dump_dir``)."""
        return {
            "urls": list(self.options.urls),
            "transport": "vllm",
            "engine": "vllm",
            "concurrency": self.concurrency,
            "dump_dir": str(self.dump.path) if self.dump else None,
        }

    def _post(self, url: str, rid: str, ids: list[int], timeout: float | None = None) -> bytes:
        """One /v1/completions call (prefill and one token); RetryableError for what another attempt
        may fix (timeouts, connections, 5xx, 408, 429), RefusedError for any other refusal (4xx)."""
        body = {"model": self._facts[url].model, "prompt": list(ids), "max_tokens": 1, "temperature": 0}
        headers = {"X-Request-Id": dumps.request_id(self.options.tag, rid)}
        return post_generate(self._session(), url, body, timeout or self.options.request_timeout,
                             path="/v1/completions", headers=headers)

    @staticmethod
    def _file_of(body: bytes, url: str) -> Path:
        payload = json.loads(body)
        path = ((payload or {}).get("kv_transfer_params") or {}).get("hidden_states_path")
        if not path:
            raise RuntimeError(
                f"{url}: the answer names no hidden-states file (kv_transfer_params); was the "
                "server restarted without capture? relaunch it with hsmon vllm-serve"
            )
        return Path(path)

    def _decode(self, body: bytes, url: str, row: int, want: int, hidden: int, captures: int) -> RowStates:
        try:
            path = self._file_of(body, url)
        except ValueError as exc:
            raise RuntimeError(f"row {row}: {url}: unreadable response body ({exc})") from None
        if self._read_delay:
            time.sleep(self._read_delay)
        try:
            data = dumps.take(path, self.options.dump_wait, url, getattr(self._row_ids, "ids", None))
            last, aux = dumps.split(data["hidden_states"], captures, hidden, self.torch_dtype, self.norm)
        except ValueError as exc:
            raise RuntimeError(f"row {row}: {url}: bad hidden-states file: {exc}") from None
        return RowStates(last, aux)

    def _one(self, row: int, ids: list[int]) -> RowStates:
        self._row_ids.ids = ids  # what _decode checks the file's tokens against (this thread's row)
        return super()._one(row, ids)

    def _discard_control(self, body: bytes, url: str) -> None:
        """The control request's file is not a row's: wait for its write, then remove it."""
        try:
            path = self._file_of(body, url)
            dumps.wait_unlocked(path, 10.0, url)
        except (ValueError, RuntimeError, OSError):
            return
        dumps.remove(path)

    def close(self) -> None:
        super().close()
        for other in self._others:
            other.clean()

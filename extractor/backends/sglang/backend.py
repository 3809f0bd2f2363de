"""The `sglang` backend: one /generate request per row, N in flight, over one or more servers."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests
import torch

from extractor.backends.base import Backend, ModelInfo, RowRejected, RowStates, RunContext
from extractor.backends.sglang import preflight, transports
from extractor.backends.sglang.attempts import AttemptAgain, judge, post_generate, probe_ids, request_row
from extractor.backends.sglang.dumpdir import PROBE_PREFIX, DumpDir
from extractor.backends.sglang.options import SGLangOptions
from extractor.backends.sglang.pool import ServerPool

# tests only: each dump file is taken this much later, so that it lies in the dump directory for a
# while whatever the machine's speed (docs/development.md, "Signals mid-run")
READ_DELAY_ENV = "HSMON_SGLANG_READ_DELAY_S"


class SGLangBackend(Backend):
    """Rows as /generate requests; hidden states from the JSON body or from dump files."""

    name = "sglang"

    def __init__(self, model_dir: str, capture_points: Sequence[int], info: ModelInfo,
                 options: SGLangOptions, context: RunContext) -> None:
        self.capture_points = list(capture_points)
        self.info = info
        self.options = options
        self._read_delay = float(os.environ.get(READ_DELAY_ENV) or 0)
        self.transport = options.transport
        self.torch_dtype = getattr(torch, info.dtype)
        self.facts = options.facts or preflight.check_servers(
            options.urls, self.capture_points, self.transport, info.dtype, options.dump_dir,
            timeout=min(options.request_timeout, 30.0))
        for facts in self.facts:  # which SGLang and capture adapter each server runs
            print(f"hsmon extract: {preflight.release_line(facts)}", file=sys.stderr, flush=True)
        self.concurrency = options.concurrency or preflight.default_concurrency(
            self.facts, options.longest_row, self.transport)
        self._chunk_size = {f.url: f.chunked_prefill_size for f in self.facts}
        self.pool = ServerPool(options.urls, context.events, context.progress, context.stop_event,
                               give_up_s=options.give_up_after,
                               max_input={f.url: f.max_input for f in self.facts})
        self.dump: DumpDir | None = None
        if self.transport == "shm":
            assert options.dump_dir is not None
            self.dump = DumpDir(Path(options.dump_dir), options.max_dump_bytes, options.dump_min_free,
                                context.events, context.progress, context.stop_event,
                                owner=options.dump_owner)
            self.dump.prepare()
        self._nonce = options.dump_owner + os.urandom(4).hex()  # whose files: dumpdir.owned
        self._attempts = self._probes = 0
        self._lock = threading.Lock()
        self._local = threading.local()
        self._executor = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="hsmon-sglang")
        self.stats = {"requests": 0, "orphans_reused": 0, "request_seconds": 0.0, "client_seconds": 0.0}

    def captured(self) -> dict[str, Any]:
        """For the manifest's ``run`` record: the points each server's model really captures."""
        return {"points": self.capture_points, "servers": [
            {"url": f.url, "model_class": (f.plugin or {}).get("model_class"), "layer_ids": f.layer_ids,
             "captured_points": f.captured_points} for f in self.facts]}

    def describe(self) -> dict[str, Any]:
        """Fields for the run's ``start`` event (the engine-watch helper reads ``urls``/``transport``)."""
        return {"urls": list(self.options.urls), "transport": self.transport, "concurrency": self.concurrency,
                "dump_dir": self.options.dump_dir}

    def extract(self, batch: Sequence[Sequence[int]],
                rows: Sequence[int] | None = None) -> list[RowStates | RowRejected]:
        rows = list(rows) if rows is not None else list(range(len(batch)))
        futures = [self._executor.submit(self._one, row, list(ids))
                   for row, ids in zip(rows, batch, strict=True)]
        return [f.result() for f in futures]

    # -- one row -------------------------------------------------------------------------
    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        return session

    def _rid(self, row: int) -> str:
        with self._lock:
            self._attempts += 1
            return f"r{row}-{self._nonce}-{self._attempts}"

    def _one(self, row: int, ids: list[int]) -> RowStates | RowRejected:
        hidden, captures = self.info.hidden_size, len(self.capture_points)
        if self.dump is not None:
            orphan = self.dump.take_orphan(row)
            if orphan is not None:
                try:
                    states = transports.take_dump(orphan, hidden, captures, self.torch_dtype, len(ids), 0.0,
                                                  self.capture_points)
                    with self._lock:
                        self.stats["orphans_reused"] += 1
                    return states
                except (ValueError, OSError, RuntimeError):
                    pass  # incomplete or from other settings: removed by take_dump, computed again
        clock: dict[str, float] = {}

        def post(url: str) -> bytes:
            clock["started"] = time.perf_counter()
            body = self._post(url, self._rid(row), ids)
            clock["answered"] = time.perf_counter()
            return body

        def finish(body: bytes, url: str) -> RowStates:
            states = self._read_answer(body, url, row, len(ids))
            with self._lock:
                self.stats["requests"] += 1
                self.stats["request_seconds"] += clock["answered"] - clock["started"]
                self.stats["client_seconds"] += time.perf_counter() - clock["answered"]
            return states

        return request_row(self.pool, row, len(ids), post, finish, lambda url: self._evidence(url, ids),
                           self.options.row_attempts, before=self.dump.wait_for_room if self.dump else None)

    def _read_answer(self, body: bytes, url: str, row: int, want: int) -> RowStates:
        """The row's hidden states from the answer; AttemptAgain when they must be asked for again."""
        try:
            return self._decode(body, url, row, want, self.info.hidden_size, len(self.capture_points))
        except transports.DumpError as exc:
            if exc.errno_name not in ("ENOSPC", "EDQUOT"):
                raise
            # /dev/shm filled between the room check and the write: wait for room, try again
            raise AttemptAgain(str(exc), judge=False) from None
        except transports.DumpLate as exc:
            # the response came, the file never did: a server killed with the write queued
            # reads "down" (pause, then the row again); one that serves (restarted meanwhile,
            # or writing where we cannot read) gets the row again, a bounded number of times
            raise AttemptAgain(str(exc), judge=True) from None

    def _evidence(self, url: str, ids: list[int]) -> str:
        """After a row's request failed on ``url``: does the server answer OTHER requests now? A
        control request (the row's first few tokens, under a rid of its own) says (attempts.judge);
        a control's dump file is not a row's: removed."""
        with self._lock:
            self._probes += 1
            rid = f"{PROBE_PREFIX}{self._nonce}-{self._probes}"
        bodies: list[bytes] = []
        verdict = judge(lambda: bodies.append(self._post(url, rid, probe_ids(ids),
                                                         timeout=min(self.options.request_timeout, 60.0))))
        if verdict == "serves":
            self._discard_control(bodies[0], url)
        return verdict

    def _discard_control(self, body: bytes, url: str) -> None:
        """The control request's dump file is not a row's: remove it."""
        if self.transport == "shm":
            with contextlib.suppress(ValueError, KeyError, TypeError, OSError, RuntimeError):
                ticket = transports.dump_path(json.loads(body), url, -1)
                with contextlib.suppress(RuntimeError):
                    transports.wait_for_file(ticket, 10.0)
                os.unlink(ticket.path)

    def _post(self, url: str, rid: str, ids: list[int], timeout: float | None = None) -> bytes:
        """One /generate call of a row (attempts.post_generate: what is retried, what is refused)."""
        body = transports.request_body(rid, ids, self.transport, self.options.dump_dir)
        return post_generate(self._session(), url, body, timeout or self.options.request_timeout)

    def _decode(self, body: bytes, url: str, row: int, want: int, hidden: int, captures: int) -> RowStates:
        try:
            payload = json.loads(body)
        except ValueError as exc:
            raise RuntimeError(f"row {row}: {url}: unreadable response body ({exc})") from None
        if self.transport == "json":
            return transports.decode_json(payload, hidden, captures, self.torch_dtype, row, want, url,
                                          self._chunk_size[url])
        path = transports.dump_path(payload, url, row)
        if self._read_delay:
            time.sleep(self._read_delay)
        try:
            return transports.take_dump(path, hidden, captures, self.torch_dtype, want,
                                        self.options.dump_wait, self.capture_points)
        except ValueError as exc:
            raise RuntimeError(f"row {row}: {url}: bad dump file: {exc}") from None

    def close(self) -> None:
        from extractor.errors import log

        self._executor.shutdown(wait=True, cancel_futures=True)
        st = self.stats
        if st["requests"]:
            log(f"{self.name}: {st['requests']} requests ({st['orphans_reused']} dump files reused), request "
                f"time {st['request_seconds']:.3f} s, client time {st['client_seconds']:.3f} s "
                f"({st['client_seconds'] / max(st['request_seconds'], 1e-9):.3f} of request time); "
                f"per server: {', '.join(f'{u} {n}' for u, n in self.pool.served().items())}")
        if self.dump is not None:
            self.dump.clean()

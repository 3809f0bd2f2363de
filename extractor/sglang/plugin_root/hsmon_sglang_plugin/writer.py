"""Off the scheduler's thread: host copies of one request's rows, and the thread that writes them.

The hook (``capture.py``) only *starts* the copy of each chunked-prefill piece and, when the last
piece is in, enqueues the request; one writer thread per scheduler process waits for the copies,
writes ``<rid>.safetensors`` (temp name, rename) or, when that fails, ``<rid>.error`` (one line of
JSON), so the client, which may have its response before the file exists, always learns the end.

- CUDA: each piece is copied ``non_blocking`` into pinned host memory (torch's caching host
  allocator) and a CUDA event is recorded on the current stream; the writer waits on the events.
- CPU: the same path without events. The copy itself stays on the hook (SGLang reuses the batch's
  tensors once the hook returns), only the write moves.

Backpressure (explicit, counted): the bytes of pieces held for the writer are bounded by
``HSMON_PLUGIN_POOL_BYTES`` (default 2 GiB). A piece that does not fit is copied synchronously to
pageable memory and its request is written on the scheduler's thread, as before this module
(``sync_fallbacks``). Holding the request until there is room was the alternative: the hook cannot
defer one request's output without blocking the whole batch, so holding stalls the scheduler for
*other* requests' writes, which is worse than the fallback's own write.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from hsmon_sglang_plugin.dump import error_path, write_dump

POOL_BYTES_ENV = "HSMON_PLUGIN_POOL_BYTES"
SYNC_ENV = "HSMON_PLUGIN_SYNC"  # "1": the old path (copy and write on the hook), for comparisons
WRITE_DELAY_ENV = "HSMON_PLUGIN_WRITE_DELAY_S"  # tests: a slow writer, made deterministic
DEFAULT_POOL_BYTES = 2 << 30
SAMPLES = 2048  # recent per-request hook times kept for /server_info


@dataclass
class Piece:
    """One chunked-prefill piece on the host (or on its way there)."""

    aux: torch.Tensor
    last: torch.Tensor
    event: Any | None  # a recorded torch.cuda.Event, None once the copy is known complete
    nbytes: int
    pooled: bool  # counted in the pool (released by whoever writes the request)


@dataclass
class Job:
    """One request whose last piece is in: what the writer needs to write its file."""

    rid: str
    dump_dir: str
    pieces: list[Piece]
    metadata: dict[str, str]


@dataclass
class Stats:
    """Counters for /server_info (``internal_states[i]["hsmon_capture"]``)."""

    pool_limit_bytes: int
    pool_bytes_in_use: int = 0
    queue_depth: int = 0
    requests: int = 0
    files_written: int = 0
    write_errors: int = 0
    sync_fallbacks: int = 0
    write_seconds: float = 0.0
    hook_seconds: float = 0.0
    # (path "async"|"sync"|"fallback", hook ms for the whole request, MB captured)
    hook_samples: deque = field(default_factory=lambda: deque(maxlen=SAMPLES))

    def snapshot(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "hook_samples"}
        out["hook_samples"] = [list(s) for s in self.hook_samples]
        return out


def piece_bytes(aux: torch.Tensor, last: torch.Tensor) -> int:
    return aux.numel() * aux.element_size() + last.numel() * last.element_size()


class Writer:
    """The bounded host pool, the queue and the writer thread of one scheduler process."""

    def __init__(self, pool_bytes: int | None = None, sync: bool | None = None) -> None:
        env = os.environ
        limit = pool_bytes if pool_bytes is not None else int(env.get(POOL_BYTES_ENV) or DEFAULT_POOL_BYTES)
        self.sync = sync if sync is not None else env.get(SYNC_ENV, "") not in ("", "0")
        self.delay = float(env.get(WRITE_DELAY_ENV) or 0.0)
        self.stats = Stats(pool_limit_bytes=limit)
        self._lock = threading.Lock()
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    # -- on the scheduler's thread -------------------------------------------------------------
    def copy(self, aux: torch.Tensor, last: torch.Tensor, force_sync: bool = False) -> Piece:
        """Start the host copy of one piece: into the pool when it has room, else synchronously."""
        nbytes = piece_bytes(aux, last)
        pooled = False
        if not (self.sync or force_sync):
            with self._lock:
                if self.stats.pool_bytes_in_use + nbytes <= self.stats.pool_limit_bytes:
                    self.stats.pool_bytes_in_use += nbytes
                    pooled = True
        if pooled and aux.is_cuda:
            host_aux = torch.empty(aux.shape, dtype=aux.dtype, pin_memory=True)
            host_last = torch.empty(last.shape, dtype=last.dtype, pin_memory=True)
            stream = torch.cuda.current_stream()
            # the batch's tensors may come from another stream (the forward's): tell the caching
            # allocator they are in use on this one until the copies are done
            aux.record_stream(stream)
            last.record_stream(stream)
            host_aux.copy_(aux, non_blocking=True)
            host_last.copy_(last, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)  # after the copies
            return Piece(host_aux, host_last, event, nbytes, True)
        # CPU (the batch's tensors are reused after the hook), or no room: a synchronous copy
        return Piece(aux.to("cpu", copy=True), last.to("cpu", copy=True), None, nbytes, pooled)

    def release(self, pieces: list[Piece]) -> None:
        """Give back the pool bytes of pieces that will not be written (an abandoned request)."""
        with self._lock:
            self.stats.pool_bytes_in_use -= sum(p.nbytes for p in pieces if p.pooled)

    def submit(self, job: Job, sync: bool = False) -> dict | None:
        """Queue the request for the writer thread (None), or, when a piece missed the pool,
        write it here and return the marker (the counted fallback); ``sync``: the old path."""
        sync = sync or self.sync
        if sync or not all(p.pooled for p in job.pieces):
            if not sync:
                with self._lock:
                    self.stats.sync_fallbacks += 1
            return self._write(job)
        with self._lock:
            self.stats.queue_depth += 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="hsmon-writer", daemon=True)
                self._thread.start()
        self._queue.put(job)
        return None

    def record_hook(self, path: str, seconds: float, nbytes: int) -> None:
        with self._lock:
            self.stats.requests += 1
            self.stats.hook_seconds += seconds
            self.stats.hook_samples.append((path, round(seconds * 1e3, 4), round(nbytes / 1e6, 4)))

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return self.stats.snapshot()

    # -- on the writer's thread ----------------------------------------------------------------
    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            if self.delay:
                time.sleep(self.delay)
            self._write(job)
            with self._lock:
                self.stats.queue_depth -= 1

    def _write(self, job: Job) -> dict:
        started = time.perf_counter()
        for piece in job.pieces:
            if piece.event is not None:
                piece.event.synchronize()
        pieces = job.pieces
        aux = torch.cat([p.aux for p in pieces]) if len(pieces) > 1 else pieces[0].aux
        last = torch.cat([p.last for p in pieces]) if len(pieces) > 1 else pieces[0].last
        tensors = {"hidden_state": last, "aux_hidden_state": aux}
        marker = write_dump(job.dump_dir, job.rid, tensors, job.metadata)
        if not marker["ok"]:
            write_error(job.dump_dir, job.rid, marker)
        with self._lock:
            self.stats.pool_bytes_in_use -= sum(p.nbytes for p in pieces if p.pooled)
            self.stats.write_seconds += time.perf_counter() - started
            self.stats.files_written += bool(marker["ok"])
            self.stats.write_errors += not marker["ok"]
        return marker

    def drain(self, timeout: float = 30.0) -> None:
        """At exit: let queued writes finish (bounded), so a clean stop loses no file."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        self._queue.put(None)
        thread.join(timeout)


def write_error(dump_dir: str, rid: str, marker: dict) -> None:
    """``<dump_dir>/<rid>.error``: the failed write's marker on one line (temp name, rename)."""
    final = error_path(dump_dir, rid)
    tmp = os.path.join(dump_dir, f".{rid}.error.tmp")
    line = json.dumps({"error": marker.get("error"), "errno": marker.get("errno")}) + "\n"
    with contextlib.suppress(OSError):  # nowhere left to say it: the client's wait times out
        os.makedirs(dump_dir, mode=0o700, exist_ok=True)
        with open(tmp, "w") as fh:
            fh.write(line)
        os.rename(tmp, final)


_writer: Writer | None = None


def get_writer() -> Writer:
    """This process's writer (made on first use, drained at exit)."""
    global _writer
    if _writer is None:
        _writer = Writer()
        atexit.register(_writer.drain)
    return _writer

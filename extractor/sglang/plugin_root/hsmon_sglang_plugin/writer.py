"""Off the scheduler's thread: host copies of one request's rows, and the thread that writes them.

The hook (``capture.py``) only *holds* each chunked-prefill piece and, when the last piece is in,
enqueues the request; one writer thread per scheduler process waits for the copies, writes
``<rid>.safetensors`` (temp name, rename) or, when that fails, ``<rid>.error`` (one line of JSON),
so the client, which may have its response before the file exists, always learns the end.

- CPU: nothing is copied on the hook. The piece is a *view* of the forward's output tensors,
  which SGLang 0.5.23 allocates afresh every forward and never writes again: the captured layers
  are cloned per layer and concatenated (``layers/aux_hidden_states.py``
  ``AuxHiddenStateList.capture``, ``pack_aux_hidden_states``), the last layer is the final norm's
  output (``layers/layernorm.py`` ``forward_native``/``forward_cpu``), the packer's preallocated
  buffer exists only for the decode CUDA graph (``forward_batch_info.py``
  ``aux_hidden_states_buffer``). The writer thread writes the pieces straight from the views into
  the file (``dump.save_parts``). The pool counts what the views keep alive: the whole batch
  tensor's storage, once however many requests hold rows of it. Should
  a later SGLang reuse the buffer, a later forward's output arrives on a storage still held: the
  requests holding it get ``<rid>.error`` (never a wrong file) and the plugin copies from then on.
- CUDA: each piece is copied ``non_blocking`` into pinned host memory (torch's caching host
  allocator) and a CUDA event is recorded on the current stream; the writer waits on the events.

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
import itertools
import json
import logging
import os
import queue
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from hsmon_sglang_plugin.dump import DumpRefused, error_path, open_dump_dir, write_dump

POOL_BYTES_ENV = "HSMON_PLUGIN_POOL_BYTES"
SYNC_ENV = "HSMON_PLUGIN_SYNC"  # "1": the old path (copy and write on the hook), for comparisons
WRITE_DELAY_ENV = "HSMON_PLUGIN_WRITE_DELAY_S"  # tests: a slow writer, made deterministic
DEFAULT_POOL_BYTES = 2 << 30
SAMPLES = 2048  # recent per-request hook times kept for /server_info

logger = logging.getLogger("hsmon_sglang_plugin")


@dataclass
class Piece:
    """One chunked-prefill piece on the host (or on its way there), or a view of SGLang's own."""

    aux: torch.Tensor
    last: torch.Tensor
    event: Any | None  # a recorded torch.cuda.Event, None once the copy is known complete
    nbytes: int  # the piece's own bytes (what the file will hold)
    pooled: bool  # counted in the pool (released by whoever writes the request)
    held: tuple[int, ...] = ()  # the pool entries (storages) this piece keeps alive


@dataclass
class Held:
    """One storage the pool keeps alive: a forward's output tensor (views) or a host copy."""

    nbytes: int  # the WHOLE storage: a view of one row keeps the batch's tensor alive
    refs: int
    forward: Any  # weakref to the forward's output it came from (None: the plugin's own copy)


@dataclass
class Job:
    """One request whose last piece is in: what the writer needs to write its file."""

    rid: str
    dump_dir: str
    pieces: list[Piece]
    metadata: dict[str, str]
    dir_fd: int | None = None  # the checked dump directory, held for this job (closed once written)


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
    buffer_reuses: int = 0  # a later forward's output on a storage still held (views turned off)
    writer_failures: int = 0  # the writer itself raised (a CUDA error, a bug): <rid>.error, thread goes on
    write_seconds: float = 0.0
    hook_seconds: float = 0.0
    # (path "async"|"sync"|"fallback", hook ms for the whole request, MB captured, of the ms
    # those on the hook thread's CPU: wall minus CPU is time waiting for the GIL or for a core)
    hook_samples: deque = field(default_factory=lambda: deque(maxlen=SAMPLES))

    def snapshot(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "hook_samples"}
        out["hook_samples"] = [list(s) for s in self.hook_samples]
        return out


def piece_bytes(aux: torch.Tensor, last: torch.Tensor) -> int:
    return aux.numel() * aux.element_size() + last.numel() * last.element_size()


REUSED = (
    "SGLang wrote a later forward's output into memory that still held this request's rows "
    "(a reused output buffer): no file written, the rows would be wrong. The plugin copies on "
    "the hook from now on; report the SGLang version"
)


class Writer:
    """The bounded host pool, the queue and the writer thread of one scheduler process."""

    def __init__(self, pool_bytes: int | None = None, sync: bool | None = None) -> None:
        env = os.environ
        limit = pool_bytes if pool_bytes is not None else int(env.get(POOL_BYTES_ENV) or DEFAULT_POOL_BYTES)
        self.sync = sync if sync is not None else env.get(SYNC_ENV, "") not in ("", "0")
        self.views = True  # CPU tensors are held as views (off once a reused buffer was seen)
        self.delay = float(env.get(WRITE_DELAY_ENV) or 0.0)
        self.stats = Stats(pool_limit_bytes=limit)
        self._lock = threading.Lock()
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._held: dict[int, Held] = {}
        self._clobbered: set[int] = set()
        self._copy_ids = itertools.count(-1, -1)  # pool keys of the plugin's own host copies

    # -- on the scheduler's thread -------------------------------------------------------------
    def hold(self, aux: torch.Tensor, last: torch.Tensor, forward: Any = None,
             force_sync: bool = False) -> Piece:
        """Keep one piece for the writer: on CPU views of ``forward``'s output tensors (SGLang
        allocates them afresh every forward, so nothing is copied here), on CUDA the start of a
        copy into pinned memory; when the pool has no room, a synchronous copy (the fallback)."""
        nbytes = piece_bytes(aux, last)
        if self.sync or force_sync:
            return Piece(aux.to("cpu", copy=True), last.to("cpu", copy=True), None, nbytes, False)
        ref = weakref.ref(forward) if forward is not None else None
        with self._lock:
            if ref is not None:
                self._check_reuse(aux, last, ref)
            plan = [self._plan(t, ref) for t in (aux, last)]
            keys = tuple(dict.fromkeys(key for key, _ in plan))
            new = {key: held for key, held in plan if key not in self._held}
            room = self.stats.pool_bytes_in_use + sum(h.nbytes for h in new.values())
            if room > self.stats.pool_limit_bytes:
                return Piece(aux.to("cpu", copy=True), last.to("cpu", copy=True), None, nbytes, False)
            self._held.update(new)
            for key in keys:
                self._held[key].refs += 1
            self.stats.pool_bytes_in_use = room
            views = self.views
        if not (aux.is_cuda or last.is_cuda):
            if not views:  # a reused buffer was seen: copy on the hook, as before the views
                aux, last = aux.clone(), last.clone()
            return Piece(aux, last, None, nbytes, True, keys)
        stream = torch.cuda.current_stream()
        host = [_start_copy(t, stream, views) for t in (aux, last)]
        event = torch.cuda.Event()
        event.record(stream)  # after the copies
        return Piece(host[0], host[1], event, nbytes, True, keys)

    def _plan(self, tensor: torch.Tensor, ref: Any) -> tuple[int, Held]:
        """The pool entry a tensor needs: its storage when held as a view, else a new copy."""
        if tensor.is_cuda or not self.views:
            size = tensor.numel() * tensor.element_size()
            return next(self._copy_ids), Held(size, 0, None)
        storage = tensor.untyped_storage()
        return storage.data_ptr(), Held(storage.nbytes(), 0, ref)

    def _check_reuse(self, aux: torch.Tensor, last: torch.Tensor, ref: Any) -> None:
        """A storage still held for an earlier forward that carries this forward's output: SGLang
        reused the buffer, so what the views hold is already overwritten (lock held)."""
        for tensor in (aux, last):
            if tensor.is_cuda or not self.views:
                continue
            key = tensor.untyped_storage().data_ptr()
            held = self._held.get(key)
            if held is not None and held.forward is not None and held.forward() is not ref():
                self._clobbered.add(key)
                self.stats.buffer_reuses += 1
                self.views = False
                logger.error("hsmon capture plugin: %s", REUSED)

    def release(self, pieces: list[Piece]) -> None:
        """Give back the pool entries of pieces that will not be written (an abandoned request)."""
        with self._lock:
            self._unhold(pieces)

    def _unhold(self, pieces: list[Piece]) -> None:
        """Drop the pieces' references to their storages; the last one frees its bytes (lock held)."""
        for piece in pieces:
            for key in piece.held:
                held = self._held[key]
                held.refs -= 1
                if held.refs == 0:
                    del self._held[key]
                    self._clobbered.discard(key)
                    self.stats.pool_bytes_in_use -= held.nbytes
            piece.held = ()

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

    def record_hook(self, path: str, seconds: float, nbytes: int, cpu_seconds: float) -> None:
        with self._lock:
            self.stats.requests += 1
            self.stats.hook_seconds += seconds
            self.stats.hook_samples.append((path, round(seconds * 1e3, 4), round(nbytes / 1e6, 4),
                                            round(cpu_seconds * 1e3, 4)))

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return self.stats.snapshot()

    # -- on the writer's thread ----------------------------------------------------------------
    def _run(self) -> None:
        """Write the queued requests; nothing it meets ends the thread (``_write`` turns a failure
        into the request's ``<rid>.error``, and this loop logs whatever escapes even that)."""
        while True:
            job = self._queue.get()
            if job is None:
                return
            try:
                if self.delay:
                    time.sleep(self.delay)
                self._write(job)
            except Exception:
                logger.exception("hsmon capture plugin: the writer thread failed on request %s", job.rid)
            finally:
                with self._lock:
                    self.stats.queue_depth -= 1

    def _write(self, job: Job) -> dict:
        """Write the request's file, or its ``<rid>.error`` whatever fails (a CUDA error on the
        copy's event, a bug): the client learns the end either way, counted and logged."""
        started = time.perf_counter()
        try:
            marker = self._write_file(job)
        except Exception as exc:
            logger.exception("hsmon capture plugin: writing request %s failed", job.rid)
            marker = {"mode": "dump", "ok": False, "errno": None,
                      "error": f"the capture plugin's writer failed: {type(exc).__name__}: {exc}"[:500]}
            with self._lock:
                self.stats.writer_failures += 1
        if not marker["ok"]:
            write_error(job.dump_dir, job.rid, marker, job.dir_fd)
        if job.dir_fd is not None:
            os.close(job.dir_fd)
            job.dir_fd = None
        with self._lock:
            self._unhold(job.pieces)
            self.stats.write_seconds += time.perf_counter() - started
            self.stats.files_written += bool(marker["ok"])
            self.stats.write_errors += not marker["ok"]
        return marker

    def _write_file(self, job: Job) -> dict:
        for piece in job.pieces:
            if piece.event is not None:
                piece.event.synchronize()
        pieces = job.pieces
        with self._lock:
            clobbered = any(key in self._clobbered for p in pieces for key in p.held)
        if clobbered:
            return {"mode": "dump", "ok": False, "error": REUSED, "errno": None}
        # the copy out of SGLang's tensors (CPU views) is the file write itself, piece by
        # piece, off the scheduler's thread (dump.save_parts)
        tensors = {"hidden_state": [p.last for p in pieces], "aux_hidden_state": [p.aux for p in pieces]}
        return write_dump(job.dump_dir, job.rid, tensors, job.metadata, job.dir_fd)

    def drain(self, timeout: float = 30.0) -> None:
        """At exit: let queued writes finish (bounded), so a clean stop loses no file."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        self._queue.put(None)
        thread.join(timeout)


def _start_copy(tensor: torch.Tensor, stream: Any, views: bool) -> torch.Tensor:
    """A pinned host tensor that ``tensor`` is being copied into on ``stream`` (CUDA), or, when
    it is on the host already (SGLang's overlap scheduler copies ``hidden_states`` to fresh
    pinned memory before the hook), the tensor itself (a copy once views are off)."""
    if not tensor.is_cuda:
        return tensor if views else tensor.clone()
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    # the batch's tensors may come from another stream (the forward's): tell the caching
    # allocator they are in use on this one until the copies are done
    tensor.record_stream(stream)
    host.copy_(tensor, non_blocking=True)
    return host


def write_error(dump_dir: str, rid: str, marker: dict, dir_fd: int | None = None) -> None:
    """``<dump_dir>/<rid>.error``: the failed write's marker on one line (temp name, rename), through
    the checked directory's descriptor, no link followed."""
    final = os.path.basename(error_path(dump_dir, rid))
    tmp = f".{rid}.error.tmp"
    line = json.dumps({"error": marker.get("error"), "errno": marker.get("errno")}) + "\n"
    own = dir_fd is None
    with contextlib.suppress(OSError, DumpRefused):  # nowhere left to say it: the client's wait times out
        if own:
            dir_fd = open_dump_dir(dump_dir)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=dir_fd)
        with open(fd, "w") as fh:
            fh.write(line)
        os.rename(tmp, final, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    if own and dir_fd is not None:
        os.close(dir_fd)


_writer: Writer | None = None


def get_writer() -> Writer:
    """This process's writer (made on first use, drained at exit)."""
    global _writer
    if _writer is None:
        _writer = Writer()
        atexit.register(_writer.drain)
    return _writer

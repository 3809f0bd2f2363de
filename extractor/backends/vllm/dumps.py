"""vLLM's hidden-states files, as its connector writes them, read and removed by the client.

vLLM's ``ExampleHiddenStatesConnector`` (and the CPU test device built on it) writes one safetensors
file per request, ``<dump>/<request id>.safetensors`` with ``token_ids`` [n] and ``hidden_states``
[n, layers, H] (the captured layers in ascending id order), and holds an exclusive ``flock`` on
``<file>.lock`` from before the response until the write ends; it removes nothing. The client sends
``X-Request-Id: hsmon-<tag>-r<row>-<nonce>-<attempt>`` (vLLM names the file ``cmpl-<that>-0-<suffix>``),
waits for the lock, reads the file, checks its tokens, and removes both files.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time
from pathlib import Path
from typing import Any

import torch

from extractor.backends.sglang.dumpdir import DumpDir
from extractor.backends.sglang.transports import DumpLate

LOCK_SUFFIX = ".lock"


def request_id(tag: str, rid: str) -> str:
    """The X-Request-Id of one request of this job (``rid``: the sglang client's r<row>-... or probe-...)."""
    return f"hsmon-{tag}-{rid}"


def wait_unlocked(path: Path, timeout: float, url: str) -> None:
    """Wait until the connector's write of ``path`` ended (its ``.lock`` free, or gone with the file
    there); DumpLate after ``timeout`` seconds."""
    lock = Path(str(path) + LOCK_SUFFIX)
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        try:
            fd = os.open(lock, os.O_RDONLY)
        except FileNotFoundError:
            if path.exists():
                return  # written without a lock (use_synchronization_lock off)
        else:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
            finally:
                os.close(fd)
        if time.monotonic() > deadline:
            raise DumpLate(
                f"{url}: vLLM's file {path} was not written within {timeout:.0f} s of the response "
                "(the server died with the write queued, or it writes on another machine: the "
                "client reads vLLM's files where vllm-serve --dump-dir put them)"
            )
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def remove(path: Path) -> None:
    for victim in (path, Path(str(path) + LOCK_SUFFIX)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(victim)


def take(path: Path, timeout: float, url: str, ids: list[int] | None = None) -> dict[str, Any]:
    """Wait for the file, read it, remove it (and its lock); ValueError when its tokens are not ``ids``."""
    from safetensors.torch import load_file

    wait_unlocked(path, timeout, url)
    try:
        data = load_file(str(path), device="cpu")
    finally:
        remove(path)
    if {"hidden_states", "token_ids"} - set(data):
        raise ValueError(f"{path.name}: missing tensors (has {sorted(data)})")
    if ids is not None and data["token_ids"].tolist() != list(ids):
        got = data["token_ids"].numel()
        raise ValueError(f"{path.name}: holds {got} tokens that are not the {len(ids)} tokens sent")
    return data


def split(
    states: torch.Tensor, captures: int, hidden: int, dtype: torch.dtype, norm: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """(last layer after the final norm [n, H], captured points [n, K*H]) from vLLM's [n, K+1, H]: the
    K points, then the last layer's id (vllm-serve asks for it), normed here by the model's own norm."""
    n = states.shape[0]
    if states.dim() != 3 or states.shape[1:] != (captures + 1, hidden):
        raise ValueError(
            f"hidden_states of shape {list(states.shape)}, expected [{n}, {captures + 1}, {hidden}] "
            f"({captures} captured points and the last layer): is the server running the same "
            "model, started by hsmon vllm-serve with the same --layers?"
        )
    if states.dtype != dtype:
        raise ValueError(
            f"dtype {states.dtype}, this run stores {dtype} (pass --dtype to match the server's)"
        )
    aux = states[:, :captures].reshape(n, captures * hidden).clone()
    with torch.no_grad():
        last = norm(states[:, captures].unsqueeze(0))[0].to(dtype).clone()
    return last, aux


_JOB_FILE = re.compile(r"^cmpl-hsmon-(?P<tag>[0-9a-f]+)-.*\.safetensors(\.lock)?$")


class VLLMDumpDir(DumpDir):
    """The server's dump directory seen from one job: room checked before each request (as for SGLang);
    this job's files from an earlier run (a client killed mid-request) removed at the start and end."""

    def __init__(self, path: Path, tag: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(path, *args, **kwargs)
        self.tag = tag

    def _mine(self) -> list[Path]:
        with contextlib.suppress(FileNotFoundError):
            return [e for e in self.path.iterdir() if (m := _JOB_FILE.match(e.name)) and m["tag"] == self.tag]
        return []

    def prepare(self) -> None:
        self.clean()

    def clean(self) -> None:
        """Remove this job's files whose write has ended (a write under way is left to its writer)."""
        for entry in self._mine():
            data = Path(str(entry).removesuffix(LOCK_SUFFIX))
            with contextlib.suppress(DumpLate):
                wait_unlocked(data, 0.0, "")
                remove(data)

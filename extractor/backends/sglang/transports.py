"""The two ways hidden states come back from the server, and the row check both share.

- ``json``: in the HTTP response. The plugin's pack mode puts the K captured layers and the last
  layer (after the final norm) side by side in ``meta_info.hidden_states[0]`` ([seq, K*H + H]);
  stock SGLang can return only one of the two per request.
- ``shm``: the plugin's writer thread writes ``<dump_dir>/<rid>.safetensors`` (``hidden_state``
  [seq, H], ``aux_hidden_state`` [seq, K*H]), possibly after the response, which carries only
  where the file will be; the client waits for the rename, or for ``<rid>.error`` (a failed
  write, one line of JSON).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from extractor.backends.base import RowStates


class DumpLate(RuntimeError):
    """The dump file (and no error file) did not appear in time after the response."""


class ShortRowError(RuntimeError):
    """The server returned fewer rows of hidden states than the prompt has tokens."""


class DumpError(RuntimeError):
    """The plugin could not write a dump file (``errno`` tells ENOSPC apart)."""

    def __init__(self, message: str, errno_name: str | None = None) -> None:
        super().__init__(message)
        self.errno_name = errno_name


def server_message(status: int, text: str) -> str:
    """The server's own words for a refused request, on one line: SGLang answers
    ``{"error": {"message": ...}}`` (FastAPI ``{"detail": ...}``); else the body's text."""
    message: Any = None
    try:
        payload = json.loads(text)
    except ValueError:
        payload = None
    if isinstance(payload, dict):
        error = payload.get("error")
        message = error.get("message") if isinstance(error, dict) else error
        message = message or payload.get("detail") or payload.get("message")
    return " ".join(str(message or text or f"HTTP {status}").split())[:300]


def request_body(rid: str, input_ids: list[int], transport: str, dump_dir: str | None) -> dict[str, Any]:
    """The /generate request of one row: prefill only (one new token), hidden states opted in."""
    mode: dict[str, Any] = {"dump_dir": dump_dir} if transport == "shm" else {"pack_last": True}
    return {"rid": rid, "input_ids": list(input_ids), "return_hidden_states": True,
            "sampling_params": {"max_new_tokens": 1, "custom_params": {"hsmon": mode}}}


def short_row_message(row: int, got: int, want: int, url: str, chunked_prefill_size: int) -> str:
    return (f"row {row}: {url} returned hidden states for {got} of {want} tokens; SGLang drops the middle "
            f"pieces of a prompt split by chunked prefill (--chunked-prefill-size {chunked_prefill_size}, "
            f"shared by the rows in one prefill batch); relaunch the server with --chunked-prefill-size "
            f"above --max-length times --concurrency, or use --transport shm (the plugin keeps every piece)")


def marker(response: dict[str, Any], url: str) -> dict[str, Any]:
    """The plugin's ``meta_info.hsmon[0]``; an error when the plugin did not handle the request."""
    meta = response.get("meta_info") or {}
    info = meta.get("hsmon")
    if isinstance(info, list) and info:
        info = info[0]
    if not isinstance(info, dict):
        raise RuntimeError(f"{url}: the response has no hsmon marker: the capture plugin did not handle the "
                           "request (is it loaded? see docs/extract.md)")
    return info


def decode_json(response: dict[str, Any], hidden: int, captures: int, dtype: torch.dtype, row: int,
                want: int, url: str, chunked_prefill_size: int) -> RowStates:
    """Split pack mode's [seq, K*H + H] into the captured layers and the last layer."""
    info = marker(response, url)
    if info.get("mode") != "pack" or not info.get("ok", False):
        raise RuntimeError(f"row {row}: {url}: the plugin did not pack the last layer ({info})")
    states = (response.get("meta_info") or {}).get("hidden_states") or []
    if not states:
        raise RuntimeError(f"row {row}: {url} returned no hidden states (--enable-return-hidden-states?)")
    array = np.asarray(states[0], dtype=np.float32)
    width = (captures + 1) * hidden
    if array.ndim != 2 or array.shape[1] != width:
        raise RuntimeError(f"row {row}: {url} returned hidden states of shape {list(array.shape)}, expected "
                           f"[{want}, {width}] ({captures} captured layers + the last, hidden {hidden}): "
                           "is the server running the same model as --model?")
    if array.shape[0] != want:
        raise ShortRowError(short_row_message(row, array.shape[0], want, url, chunked_prefill_size))
    tensor = torch.from_numpy(array)
    if dtype != torch.float32:
        tensor = tensor.to(dtype)
    aux = tensor[:, : captures * hidden].clone()
    last = tensor[:, captures * hidden:].clone()
    return RowStates(last, aux)


@dataclass
class DumpTicket:
    """Where the plugin will put (or has put) one request's file, from its marker."""

    path: Path
    error_path: Path
    rid: str
    url: str
    tokens: int | None


def dump_path(response: dict[str, Any], url: str, row: int) -> DumpTicket:
    """Where the dump file will be (DumpError if the plugin already knows it cannot write it)."""
    info = marker(response, url)
    if info.get("mode") != "dump":
        raise RuntimeError(f"row {row}: {url}: the plugin did not dump the request ({info})")
    if not info.get("ok", False):
        raise DumpError(f"row {row}: {url}: the plugin could not write the dump file: {info.get('error')}",
                        info.get("errno"))
    path = Path(str(info["file"]))
    error = info.get("error_file")
    rid = path.name.removesuffix(".safetensors")
    tokens = info.get("tokens")
    return DumpTicket(path, Path(str(error)) if error else path.with_name(f"{rid}.error"), rid, url,
                      int(tokens) if isinstance(tokens, int) else None)


def wait_for_file(ticket: DumpTicket, timeout: float) -> None:
    """Wait for the writer thread's rename of the file, or its ``<rid>.error`` (DumpError)."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while not ticket.path.exists():
        if ticket.error_path.exists():
            raise _error_file(ticket)
        if time.monotonic() > deadline:
            raise DumpLate(f"{ticket.url}: request {ticket.rid}: dump file {ticket.path} did not appear "
                           f"within {timeout:.0f} s of the response (the server died with the write "
                           "queued, or it is on another machine: --transport shm needs a directory both "
                           "see; use --transport json)")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def _error_file(ticket: DumpTicket) -> DumpError:
    try:
        text = ticket.error_path.read_text()
        info = json.loads(text)
    except (OSError, ValueError):
        info = {"error": "unreadable error file", "errno": None}
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(ticket.error_path)
    return DumpError(f"{ticket.url}: request {ticket.rid}: the plugin could not write the dump file: "
                     f"{info.get('error')}", info.get("errno"))


def load_dump(path: Path, hidden: int, captures: int, dtype: torch.dtype, want: int,
              points: list[int] | None = None) -> RowStates:
    """Read and check one dump file: shapes, dtype, token count. ValueError says what is wrong."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        meta = fh.metadata() or {}
        names = set(fh.keys())
        if not {"hidden_state", "aux_hidden_state"} <= names:
            raise ValueError(f"{path.name}: missing tensors (has {sorted(names)})")
        last = fh.get_tensor("hidden_state")
        aux = fh.get_tensor("aux_hidden_state")
    captured = meta.get("captured_points")  # what the model really captured (the plugin asked it)
    if points is not None and captured and captured != ",".join(map(str, points)):
        raise ValueError(f"{path.name}: the server captured points {captured} (SGLang layer ids "
                         f"{meta.get('layer_ids')}), this run needs {','.join(map(str, points))}")
    tokens = int(meta.get("tokens", -1))
    if tokens != want or last.shape != (want, hidden) or aux.shape != (want, captures * hidden):
        raise ValueError(f"{path.name}: {tokens} tokens, hidden_state {list(last.shape)}, aux_hidden_state "
                         f"{list(aux.shape)}; expected {want} tokens, [{want}, {hidden}], "
                         f"[{want}, {captures * hidden}]")
    if last.dtype != dtype or aux.dtype != dtype:
        raise ValueError(f"{path.name}: dtype {last.dtype}, this run stores {dtype} (pass --dtype to match "
                         "the server's --dtype)")
    return RowStates(last, aux)


def take_dump(path: Path | DumpTicket, hidden: int, captures: int, dtype: torch.dtype, want: int,
              wait_s: float, points: list[int] | None = None) -> RowStates:
    """Wait for the file, check it, load it, delete it: its content now lives in the run's memory
    until the writer puts it into its chunk (a crash before that recomputes the row)."""
    if isinstance(path, DumpTicket):
        wait_for_file(path, wait_s)
        path = path.path
    try:
        return load_dump(path, hidden, captures, dtype, want, points)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


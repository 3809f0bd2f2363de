"""Writing one request's hidden states as a safetensors file: validation and the atomic write.

Pure functions of paths and tensors (no SGLang import), so they are tested without a server.
"""

from __future__ import annotations

import contextlib
import errno as errno_mod
import json
import os
import re
import struct
from typing import Any

_RID = re.compile(r"[A-Za-z0-9_.\-]{1,200}")


class DumpRefused(ValueError):
    """A request's dump settings that the plugin will not act on (bad rid, dump dir)."""


def check_rid(rid: str) -> str:
    """``rid`` if it is safe as a file name, else DumpRefused."""
    if not isinstance(rid, str) or not _RID.fullmatch(rid) or rid.startswith("."):
        raise DumpRefused(
            f"request id {rid!r} cannot name a dump file: use 1-200 characters of [A-Za-z0-9_.-], "
            "not starting with '.'"
        )
    return rid


def check_dump_dir(dump_dir: Any, root: str) -> str:
    """The real path of ``dump_dir`` if it lies inside ``root``, else DumpRefused."""
    if not isinstance(dump_dir, str) or not os.path.isabs(dump_dir):
        raise DumpRefused(f"dump_dir must be an absolute path, got {dump_dir!r}")
    real = os.path.realpath(dump_dir)
    real_root = os.path.realpath(root)
    if os.path.commonpath([real, real_root]) != real_root:
        raise DumpRefused(
            f"dump_dir {dump_dir} is outside the server's dump root {root} "
            "(start the server with hsmon sglang-serve --dump-dir covering it)"
        )
    return real


def final_path(dump_dir: str, rid: str) -> str:
    return os.path.join(dump_dir, f"{rid}.safetensors")


def error_path(dump_dir: str, rid: str) -> str:
    """Where the writer thread says why ``final_path`` will never appear."""
    return os.path.join(dump_dir, f"{rid}.error")


def temp_path(dump_dir: str, rid: str) -> str:
    return os.path.join(dump_dir, f".{rid}.safetensors.tmp")


def write_dump(dump_dir: str, rid: str, tensors: dict[str, Any], metadata: dict[str, str]) -> dict:
    """Write ``tensors`` (each a tensor or a list of row pieces, see ``save_parts``) to
    ``<dump_dir>/.<rid>.safetensors.tmp``, rename it to
    ``<rid>.safetensors``; return the response marker (``ok`` true or false with ``error``).

    Never raises for an OS error: the request must complete and carry the failure. No fsync:
    the dump directory is meant to be RAM-backed, and the rename alone makes a reader on the
    running system see either no file or the whole file.
    """
    tmp = temp_path(dump_dir, rid)
    final = final_path(dump_dir, rid)
    try:
        os.makedirs(dump_dir, mode=0o700, exist_ok=True)
        save_parts(tmp, tensors, metadata)
        size = os.path.getsize(tmp)
        os.rename(tmp, final)
    except Exception as exc:  # safetensors wraps some OS errors in its own exception types
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        code = getattr(exc, "errno", None)
        if code is None and "No space left" in str(exc):
            code = errno_mod.ENOSPC
        name = errno_mod.errorcode.get(code) if isinstance(code, int) else None
        return {
            "mode": "dump",
            "ok": False,
            "error": f"writing {final} failed: {exc}".replace("\n", " "),
            "errno": name,
        }
    tokens = int(metadata.get("tokens", 0))
    return {"mode": "dump", "ok": True, "file": final, "tokens": tokens, "bytes": size}


_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64"}


def save_parts(path: str, tensors: dict[str, Any], metadata: dict[str, str] | None) -> None:
    """A safetensors file of ``tensors``, each one tensor or a list of row pieces (chunked-prefill
    pieces, possibly views of larger tensors) that the file holds concatenated: the pieces are
    written one after the other, so nothing is concatenated in memory, and each write is a plain
    file write (it releases the GIL, which SGLang's scheduler thread needs). The format is
    safetensors' own: an 8-byte little-endian header length, the JSON header padded with spaces
    to 8 bytes, then the data."""
    import torch

    entries: dict[str, Any] = {}
    order: list[Any] = []
    offset = 0
    for name, value in tensors.items():
        parts = list(value) if isinstance(value, list | tuple) else [value]
        first = parts[0]
        dtype = _DTYPES.get(str(first.dtype).removeprefix("torch."))
        if dtype is None or any(p.dtype != first.dtype or p.shape[1:] != first.shape[1:] for p in parts):
            raise ValueError(f"{name}: pieces of {first.dtype} {tuple(first.shape[1:])} cannot be saved")
        size = sum(p.numel() * p.element_size() for p in parts)
        rows = sum(p.shape[0] for p in parts)
        entries[name] = {"dtype": dtype, "shape": [rows, *first.shape[1:]],
                         "data_offsets": [offset, offset + size]}
        offset += size
        order += parts
    if metadata is not None:
        entries = {"__metadata__": metadata, **entries}
    header = json.dumps(entries, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(header)))
        fh.write(header)
        for part in order:
            if part.numel():
                fh.write(memoryview(part.contiguous().reshape(-1).view(torch.uint8).numpy()))

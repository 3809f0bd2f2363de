"""Writing one request's hidden states as a safetensors file: validation and the atomic write.

Pure functions of paths and tensors (no SGLang import), so they are tested without a server.
"""

from __future__ import annotations

import contextlib
import errno as errno_mod
import json
import os
import re
import stat
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
    """The real path of ``dump_dir`` if it lies inside ``root`` (and, when it exists, is only
    ours: :func:`check_owned`), else DumpRefused."""
    if not isinstance(dump_dir, str) or not os.path.isabs(dump_dir):
        raise DumpRefused(f"dump_dir must be an absolute path, got {dump_dir!r}")
    real = os.path.realpath(dump_dir)
    real_root = os.path.realpath(root)
    if os.path.commonpath([real, real_root]) != real_root:
        raise DumpRefused(
            f"dump_dir {dump_dir} is outside the server's dump root {root} "
            "(start the server with hsmon sglang-serve --dump-dir covering it)"
        )
    with contextlib.suppress(FileNotFoundError):
        check_owned(real, os.stat(real))
    return real


def check_owned(path: str, st: os.stat_result) -> None:
    """DumpRefused unless ``path`` is a directory of this process's user that no one else may
    write (a directory another user made first, or one open to the group or others, could be
    read, filled or emptied by them)."""
    if not stat.S_ISDIR(st.st_mode):
        raise DumpRefused(f"dump_dir {path} is not a directory")
    if st.st_uid != os.geteuid():
        raise DumpRefused(f"dump_dir {path} belongs to uid {st.st_uid}, not to the server's user "
                          f"(uid {os.geteuid()}): give a directory of your own")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise DumpRefused(f"dump_dir {path} is writable by its group or others (mode "
                          f"{stat.S_IMODE(st.st_mode):04o}): chmod 700 {path}")


def _owned(path: str, st: os.stat_result) -> bool:
    try:
        check_owned(path, st)
    except DumpRefused:
        return False
    return True


def open_dump_dir(real: str) -> int:
    """The checked dump directory, made 0700 when missing, opened: the request's files are written
    through this descriptor, whatever the path names later. DumpRefused when it is not only ours."""
    try:
        os.makedirs(real, mode=0o700, exist_ok=True)
        fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise DumpRefused(f"dump_dir {real}: {exc.strerror}") from None
    try:
        check_owned(real, os.fstat(fd))
    except DumpRefused:
        os.close(fd)
        raise
    return fd


_checked_dirs: dict[tuple[str, str], tuple[str, int, int]] = {}


def held_dump_dir(dump_dir: Any, root: str) -> tuple[str, int]:
    """``check_dump_dir`` and the directory opened (``open_dump_dir``): returns its real path and a
    descriptor of the request's own (the writer closes it). The check is remembered per directory
    by its identity (device, inode), not by a descriptor held between requests, so the server
    keeps nothing open (a tmpfs under the dump root can be unmounted, a removed directory is
    gone): a job's requests skip the ``realpath`` walk while its path opens the same directory, and
    a directory made again, or swapped, is checked again."""
    key = (dump_dir, root) if isinstance(dump_dir, str) else None
    known = _checked_dirs.pop(key, None) if key is not None else None
    if known is not None:
        real, dev, ino = known
        with contextlib.suppress(OSError):  # opened as it is: never made again down this path
            fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == (dev, ino) and _owned(real, st):
                _checked_dirs[key] = known  # type: ignore[index]
                return real, fd
            os.close(fd)
    real = check_dump_dir(dump_dir, root)
    fd = open_dump_dir(real)
    if key is not None and len(_checked_dirs) < 256:
        st = os.fstat(fd)
        _checked_dirs[key] = (real, st.st_dev, st.st_ino)
    return real, fd


def final_path(dump_dir: str, rid: str) -> str:
    return os.path.join(dump_dir, f"{rid}.safetensors")


def error_path(dump_dir: str, rid: str) -> str:
    """Where the writer thread says why ``final_path`` will never appear."""
    return os.path.join(dump_dir, f"{rid}.error")


def temp_path(dump_dir: str, rid: str) -> str:
    return os.path.join(dump_dir, f".{rid}.safetensors.tmp")


def write_dump(dump_dir: str, rid: str, tensors: dict[str, Any], metadata: dict[str, str],
               dir_fd: int | None = None) -> dict:
    """Write ``tensors`` (each a tensor or a list of row pieces, see ``save_parts``) to
    ``<dump_dir>/.<rid>.safetensors.tmp``, rename it to
    ``<rid>.safetensors``; return the response marker (``ok`` true or false with ``error``).
    Through ``dir_fd`` (the checked directory, opened: :func:`held_dump_dir`; opened here when
    None), files 0600, no link followed.

    Never raises for an OS error: the request must complete and carry the failure. No fsync:
    the dump directory is meant to be RAM-backed, and the rename alone makes a reader on the
    running system see either no file or the whole file.
    """
    tmp = os.path.basename(temp_path(dump_dir, rid))
    final = final_path(dump_dir, rid)
    own = dir_fd is None
    try:
        if own:
            dir_fd = open_dump_dir(dump_dir)
        save_parts(tmp, tensors, metadata, dir_fd=dir_fd)
        size = os.stat(tmp, dir_fd=dir_fd, follow_symlinks=False).st_size
        os.rename(tmp, os.path.basename(final), src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except Exception as exc:  # safetensors wraps some OS errors in its own exception types
        if dir_fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
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
    finally:
        if own and dir_fd is not None:
            os.close(dir_fd)
    tokens = int(metadata.get("tokens", 0))
    return {"mode": "dump", "ok": True, "file": final, "tokens": tokens, "bytes": size}


_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64"}


def save_parts(path: str, tensors: dict[str, Any], metadata: dict[str, str] | None,
               dir_fd: int | None = None) -> None:
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
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600, dir_fd=dir_fd)
    with open(fd, "wb") as fh:
        fh.write(struct.pack("<Q", len(header)))
        fh.write(header)
        for part in order:
            if part.numel():
                fh.write(memoryview(part.contiguous().reshape(-1).view(torch.uint8).numpy()))

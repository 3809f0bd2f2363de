"""One writer per output: an exclusive lock held for a run's whole life.

`hsmon extract` locks its output directory (one lock per shard: the shards of one run write side by
side), `hsmon train` its `--out`, and a following trainer (`--follow`) also its spool, the one
directory it deletes from. The lock is ``flock(LOCK_EX | LOCK_NB)`` on a small file in that
directory: the kernel releases it when the process ends, however it ends (`kill -9` included), so a
lock is never stale. The file keeps the holder's PID, host and command for the refusal, which names
them in one line. The file itself stays (an empty lock file means nothing); only the flock counts.

No heavy imports: the extractor and the trainer import this module.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from hsmon.contracts import nofollow

EXTRACT_LOCK = ".hsmon-extract.lock"  # an unsharded extraction; shards: lock_name(...)
TRAIN_LOCK = ".hsmon-train.lock"  # a training's --out
FOLLOW_LOCK = ".hsmon-follow.lock"  # the spool a following trainer consumes


class OutputLocked(Exception):
    """Another live process holds the lock: the message names it (one line)."""


def extract_lock_name(shard: tuple[int, int] | None) -> str:
    """The extraction's lock file in its output directory: one per shard."""
    if shard is None or shard[1] <= 1:
        return EXTRACT_LOCK
    return f".hsmon-extract.shard-{shard[0]}-of-{shard[1]}.lock"


class WriterLock:
    """The lock a run holds until it ends (``release``, or the process's end)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self._fd = path, fd

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = -1
            nofollow.release(self.path.parent)


def acquire(directory: Path, name: str, what: str, flag: str) -> WriterLock:
    """Lock ``directory/name`` for this process, or raise `OutputLocked` naming the holder (its
    message is one line, for the caller to prefix with its command).

    ``what`` is this command ("hsmon extract": the next refusal names it), ``flag`` the option that
    names the directory ("--out"): the refusal says which to change. The directory is created when
    missing.
    """
    nofollow.anchor(directory)  # every write below it from now on: no link followed
    path = directory / name
    try:
        fd = nofollow.open_file(path, os.O_RDWR | os.O_CREAT)
    except OSError:
        nofollow.release(directory)
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        nofollow.release(directory)
        raise OutputLocked(
            f"{directory} is being written by {holder}: one writer per output; wait for it to end (or "
            f"stop it), or give another {flag}") from None
    except OSError:
        os.close(fd)
        nofollow.release(directory)
        raise
    os.ftruncate(fd, 0)
    record = {"pid": os.getpid(), "host": socket.gethostname(), "command": what, "since": time.time()}
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    return WriterLock(path, fd)


def _holder(fd: int) -> str:
    """"PID 1234 on host gpu1 (hsmon extract since 12:01:02)" from the lock file, as well as known."""
    try:
        record = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        record = {}
    if not isinstance(record, dict) or not record.get("pid"):
        return "another process (its PID is not written yet)"
    since = record.get("since")
    known = isinstance(since, (int, float))
    when = f" since {time.strftime('%H:%M:%S', time.localtime(since))}" if known else ""
    command = record.get("command") or "a process"
    return f"PID {record['pid']} on host {record.get('host') or '?'} ({command}{when})"

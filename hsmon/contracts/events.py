"""The events contract: structured progress events as JSON Lines.

Writers (extractor, trainer) emit one JSON object per line and flush after every line, so
nothing waits in a buffer whatever PYTHONUNBUFFERED says. Readers (the monitor) ignore unknown
kinds and fields and count, never raise on, lines that do not parse.

No heavy imports here: the monitor imports this module.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from hsmon.contracts import nofollow

SCHEMA_VERSION = 1

# Kinds named by the contract. Readers must still accept kinds not listed here.
START = "start"
ROW = "row"
ROWS = "rows"
CHUNK = "chunk"
REJECT = "reject"
RETRY = "retry"
PAUSE = "pause"
RESUME = "resume"
HEARTBEAT = "heartbeat"
ERROR = "error"
DONE = "done"
STOPPED = "stopped"
STEP = "step"
CHECKPOINT = "checkpoint"
EVAL = "eval"
STATE = "state"  # a monitor's job state transition
SKIP = "skip"  # a training step skipped because its loss or gradient was not finite

KNOWN_KINDS = frozenset(
    {START, ROW, ROWS, CHUNK, REJECT, RETRY, PAUSE, RESUME, HEARTBEAT, ERROR, DONE, STOPPED,
     STEP, CHECKPOINT, EVAL, STATE, SKIP}
)
# Kinds after which a job has ended on purpose (a monitor does not call it dead).
TERMINAL_KINDS = frozenset({DONE, STOPPED})
# "spool": the extractor waits for spool room; "rows": a following trainer waits for rows (contracts.spool)
PAUSE_REASONS = frozenset({"disk", "shm", "server", "spool", "rows"})


def make_event(kind: str, job: str, ts: float | None = None, **fields: Any) -> dict[str, Any]:
    """Build an event dict with the contract's common fields first."""
    event: dict[str, Any] = {"v": SCHEMA_VERSION, "ts": time.time() if ts is None else ts, "job": job,
                             "kind": kind}
    event.update(fields)
    return event


def _finite_only(value: Any, path: str, bad: list[str]) -> Any:
    """``value`` with every NaN/Inf float replaced by None; the replaced paths go to ``bad``."""
    if isinstance(value, float) and not math.isfinite(value):
        bad.append(path)
        return None
    if isinstance(value, dict):
        return {k: _finite_only(v, f"{path}.{k}" if path else str(k), bad) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_only(v, f"{path}[{i}]", bad) for i, v in enumerate(value)]
    return value


def encode_event(event: dict[str, Any]) -> str:
    """One compact JSON line (with its trailing newline).

    JSON has no NaN or Infinity: a non-finite float is written as null and its field named in
    ``nonfinite_fields``, so that a diverging loss is reported instead of killing the writer.
    """
    try:
        return json.dumps(event, separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n"
    except ValueError:
        bad: list[str] = []
        clean = _finite_only(event, "", bad)
        clean["nonfinite_fields"] = bad
        return json.dumps(clean, separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n"


class EventWriter:
    """Writes events to stdout or appends them to a file, flushing after every line.

    Thread-safe: a heartbeat thread and the main loop may emit at once.
    """

    def __init__(self, job: str, path: str | os.PathLike[str] | None = None,
                 stream: IO[str] | None = None) -> None:
        self.job = job
        self._lock = threading.Lock()
        self._owned = path is not None
        self.listeners: list[Callable[[dict[str, Any]], None]] = []  # called with each event written
        if path is not None:
            fd = nofollow.open_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # never through a link
            self._stream: IO[str] = open(fd, "a", encoding="utf-8")  # noqa: SIM115
        else:
            self._stream = stream if stream is not None else sys.stdout

    def emit(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Write one event and flush it; returns the event written."""
        event = make_event(kind, self.job, **fields)
        line = encode_event(event)
        with self._lock:
            self._stream.write(line)
            self._stream.flush()
        for listener in self.listeners:  # a terminal's progress line (hsmon/contracts/progress_line.py)
            listener(event)
        return event

    def close(self) -> None:
        with self._lock:
            if self._owned:
                self._stream.close()

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def parse_event_line(line: str | bytes) -> dict[str, Any] | None:
    """Parse one line; None when it is not a valid event (garbage, partial, or not an object).

    A valid event is a JSON object with a string ``kind``; ``ts`` and ``job`` are expected but a
    reader tolerates their absence.
    """
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError:
            return None
    line = line.strip()
    if not line:
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("kind"), str):
        return None
    return obj


def own_log() -> str | None:
    """Where this process's output goes when that is a file (its log: a start event names it, so
    that the dashboard can show it even once the process is gone); None on a terminal or a pipe."""
    import stat

    for fd in (1, 2):
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
    return None


def process_started() -> float:
    """When this process started (wall clock): a start event carries it as ``process_started_ts``, so
    that the time a job took counts its model load, which comes before the start event."""
    import psutil

    try:
        return float(psutil.Process().create_time())
    except (psutil.Error, OSError):
        return time.time()


def event_number(event: dict[str, Any], *keys: str) -> float | None:
    """The first of ``keys`` that holds a number in ``event`` (bools are not numbers), else None."""
    for key in keys:
        value = event.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
    return None


@dataclass
class EventFileReader:
    """Incremental reader of an events file that copes with what real files do.

    Handles a file that does not exist yet, truncation (size shrinks: start over), rotation (the
    inode changes: start over on the new file), a partial last line (kept until its newline
    arrives), and garbage lines (counted in ``bad_lines``, skipped).
    """

    path: str
    offset: int = 0
    inode: int | None = None
    lines: int = 0
    bad_lines: int = 0
    rotations: int = 0
    _partial: bytes = field(default=b"", repr=False)

    def poll(self, max_bytes: int = 16 * 1024 * 1024) -> list[dict[str, Any]]:
        """Read what was appended since the last poll and return the new events."""
        try:
            st = os.stat(self.path)
        except OSError:
            return []
        if self.inode is not None and (st.st_ino != self.inode or st.st_size < self.offset):
            self.rotations += 1
            self.offset = 0
            self._partial = b""
        self.inode = st.st_ino
        if st.st_size == self.offset:
            return []
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(max_bytes)
        except OSError:
            return []
        self.offset += len(data)
        data = self._partial + data
        *complete, self._partial = data.split(b"\n")
        events = []
        for raw in complete:
            if not raw.strip():
                continue
            self.lines += 1
            event = parse_event_line(raw)
            if event is None:
                self.bad_lines += 1
            else:
                events.append(event)
        return events


def iter_events(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """All valid events of a file, skipping bad lines (for tests and one-shot readers)."""
    with open(path, "rb") as fh:
        for raw in fh:
            event = parse_event_line(raw)
            if event is not None:
                yield event

"""The spool contract: the online spool, an output directory that a following trainer consumes
while it is written.

    SPOOL/hsmon-manifest*.jsonl     the layout contract, written by `hsmon extract` (one per shard)
    SPOOL/hsmon-spool.json          written by `hsmon extract --spool-max SIZE` (atomic; rewritten
                                    when a resume changes the limit): {"max_bytes": N, "ts": ts}
    SPOOL/hsmon-ledger.jsonl        the following trainer's ledger (`hsmon train --follow`); one
                                    writer (rank 0 under DDP); append-only, fsynced
    SPOOL/hsmon-train-events.jsonl  the following trainer's contract-1 events when it is given no
                                    --events FILE (job id "train"); it pauses with reason "rows"
                                    while it waits for rows, so the monitor finds both sides of an
                                    online job in the spool itself

Ledger records (one JSON object per line, ``type`` says which):
    {"type": "start", "ts": ts, "pid": n, "passes": E, "consume": bool, "step": s,
     "heldout": {...}}                  once per (re)start; ``step`` is the checkpoint step it
                                        resumes from (0 at first); ``heldout`` the rule fixed at the
                                        first start that chooses the evaluation rows
    {"type": "trained", "ts": ts, "step": s, "rows": {"i": n, ...}}
                                        passes given to rows since the previous ``trained`` record
                                        (row index as a string -> passes added), made durable
                                        before the checkpoint of step ``s``
    {"type": "skipped", "ts": ts, "step": s, "rows": k}
                                        a step skipped for non-finite values: its k rows were
                                        credited no pass (only a step that updated the weights
                                        counts) and are drawn again
    {"type": "consumed", "ts": ts, "chunk": "rows_a-b", "rows": k, "bytes": b}
                                        every training row of the chunk has had its E passes;
                                        ``bytes`` are the bytes of the rows that leave the spool
                                        (their files deleted with --consume; held-out rows stay)
    {"type": "done" | "stopped", "ts": ts, "step": s, "reason": r}
                                        the trainer ended: ``done`` when it ended by itself (r:
                                        ``done``, every row had its passes; ``max_steps``,
                                        ``out_of_time``: a limit the user set), ``stopped`` on
                                        request (a signal; r ``stopped``)

A ``start`` record voids every ``trained`` record before it whose ``step`` is greater than its
own (a checkpoint lost to a crash: those passes are given again). Trained records are written
before their checkpoint, so the ledger never counts fewer passes than the checkpoint holds.

The bytes waiting in the spool are the bytes of the rows the manifests record minus the bytes of
consumed records: what `hsmon extract --spool-max` holds below its limit and the monitor shows
(computed once, by hsmon.contracts.spool_fill, for the extractor, the trainer and the monitor).

No heavy imports here: the monitor imports this module.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hsmon.contracts import layout
from hsmon.contracts.manifest_reader import JsonlTail

SPOOL_NAME = "hsmon-spool.json"
LEDGER_NAME = "hsmon-ledger.jsonl"
TRAIN_EVENTS_NAME = "hsmon-train-events.jsonl"

# pause reasons (the events contract's ``pause`` events): the extractor waits for spool room, the
# following trainer waits for rows
PAUSE_SPOOL = "spool"
PAUSE_ROWS = "rows"


def spool_path(out_dir: str | os.PathLike[str]) -> Path:
    return Path(out_dir) / SPOOL_NAME


def ledger_path(out_dir: str | os.PathLike[str]) -> Path:
    return Path(out_dir) / LEDGER_NAME


def train_events_path(out_dir: str | os.PathLike[str]) -> Path:
    return Path(out_dir) / TRAIN_EVENTS_NAME


def write_spool_limit(out_dir: str | os.PathLike[str], max_bytes: int) -> None:
    """Record the spool's limit (atomic), so that the trainer and the monitor know it is a spool."""
    payload = json.dumps({"max_bytes": int(max_bytes), "ts": time.time()}).encode()
    layout.atomic_write(spool_path(out_dir), lambda fh: fh.write(payload))


def read_spool_limit(out_dir: str | os.PathLike[str]) -> int | None:
    """The spool's limit in bytes, or None when the directory is no spool (or the file is unreadable)."""
    try:
        value = json.loads(spool_path(out_dir).read_bytes()).get("max_bytes")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


@dataclass
class Ledger:
    """Running totals of a ledger, fed record by record (``add``) in file order. With
    ``track_passes`` (the trainer's resume, tests) it keeps every row's pass count; without it (the
    monitor) its memory does not grow with the rows."""

    track_passes: bool = True
    passes_target: int | None = None
    consume: bool = False
    trainer_pid: int | None = None
    starts: int = 0
    step: int = 0
    consumed_chunks: set[str] = field(default_factory=set)
    consumed_rows: int = 0
    consumed_bytes: int = 0
    skipped_steps: int = 0  # steps skipped for non-finite values (no pass credited)
    ended: str | None = None  # "done" or "stopped" after the last start
    ended_reason: str | None = None  # its reason: done, max_steps, out_of_time, stopped
    last_ts: float | None = None
    passes: dict[int, int] = field(default_factory=dict)
    start_step: int = 0  # the last start's step (its checkpoint's; 0 for a fresh start)
    out: str | None = None  # the last start's training --out
    trained_since_start: int = 0  # trained records after the last start
    # trained records (step, save, rows) since the last start, kept until a start says which
    # survived: those of a later step, or a later save, than its checkpoint's
    _pending: list[tuple[int, int | None, dict[int, int]]] = field(default_factory=list)

    def add(self, record: dict[str, Any]) -> None:
        kind = record.get("type")
        ts = record.get("ts")
        if isinstance(ts, (int, float)):
            self.last_ts = float(ts)
        if kind == "start":
            self._start(record)
        elif kind == "trained":
            step = _int(record.get("step")) or 0
            self.step = max(self.step, step)
            self.trained_since_start += 1
            if not self.track_passes:
                return
            rows = record.get("rows") if isinstance(record.get("rows"), dict) else {}
            added = {int(k): int(v) for k, v in rows.items() if str(k).isdigit() and isinstance(v, int)}
            self._pending.append((step, _int(record.get("save")), added))
            for row, n in added.items():
                self.passes[row] = self.passes.get(row, 0) + n
        elif kind == "consumed":
            chunk = str(record.get("chunk", ""))
            if chunk and chunk not in self.consumed_chunks:
                self.consumed_chunks.add(chunk)
                self.consumed_rows += _int(record.get("rows")) or 0
                self.consumed_bytes += _int(record.get("bytes")) or 0
        elif kind == "skipped":
            self.skipped_steps += 1
        elif kind in ("done", "stopped"):
            self.ended = str(kind)
            reason = record.get("reason")
            self.ended_reason = reason if isinstance(reason, str) else None

    def _start(self, record: dict[str, Any]) -> None:
        resume_step, resume_save = _int(record.get("step")) or 0, _int(record.get("save"))

        def lost(step: int, save: int | None) -> bool:
            """Trained, but the checkpoint that held it was never written (a kill inside a save,
            the final one included: it may write its step's checkpoint again) or was lost."""
            return step > resume_step or (save is not None and resume_save is not None and save > resume_save)

        for step, save, added in self._pending:
            if lost(step, save):
                for row, n in added.items():
                    self.passes[row] -= n
        self._pending = [p for p in self._pending if not lost(p[0], p[1])]
        self.step = self.start_step = resume_step
        self.trained_since_start = 0
        out = record.get("out")
        self.out = out if isinstance(out, str) else None
        self.starts += 1
        self.ended = self.ended_reason = None
        self.passes_target = _int(record.get("passes")) or self.passes_target
        self.consume = bool(record.get("consume"))
        self.trainer_pid = _int(record.get("pid"))


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class LedgerReader:
    """A ledger read incrementally (an idle poll is one ``stat``); ``ledger`` holds the totals."""

    def __init__(self, out_dir: str | os.PathLike[str], track_passes: bool = True) -> None:
        self._tail = JsonlTail(str(ledger_path(out_dir)))
        self.track_passes = track_passes
        self.ledger = Ledger(track_passes=track_passes)

    def poll(self) -> Ledger:
        _, reset = self._tail.poll(self.ledger.add)
        if reset:  # replaced or truncated: start over
            self.ledger = Ledger(track_passes=self.track_passes)
            self._tail.poll(self.ledger.add)
        return self.ledger


def read_ledger(out_dir: str | os.PathLike[str]) -> Ledger:
    """The whole ledger's totals (an empty Ledger when there is none)."""
    return LedgerReader(out_dir).poll()

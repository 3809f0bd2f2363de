"""Writing rows in the contract-2 layout, on a thread that overlaps the model's compute.

Order of durability for each batch: every row file is serialized, written under a temporary
name, fsynced and renamed (``hsmon.contracts.layout.atomic_write``); then the batch's ``row`` records
are appended to the manifest in one fsynced write; then any chunk that became complete gets
its ``chunk`` record. A crash between these steps leaves files the manifest does not count,
which a resumed run rewrites with identical content.

Row records carry raw per-layer sums (extractor/row_stats.py) so that chunk statistics can be
finished after a resume without reading the files again.

The writer owns every manifest record a run appends: its ``run`` record, the rejects the scan
found, rows, chunks, and the ``done``/``stopped`` ending.
"""

from __future__ import annotations

import hashlib
import io
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from extractor.disk_room import WRITE_MARGIN_BYTES, Abandoned, DiskRoom
from extractor.errors import log
from extractor.row_stats import finish_stats, row_stats
from hsmon.contracts import events as ev
from hsmon.contracts import layout
from hsmon.contracts.rejects import classify


@dataclass
class RowItem:
    """One computed row, ready to be written."""

    row: int
    input_ids: list[int]
    loss_mask: list[int]
    hidden_state: torch.Tensor  # [seq, H]
    aux_hidden_state: torch.Tensor  # [seq, K*H]


@dataclass
class RejectItem:
    """A row the backend could not compute (RowRejected): written as a reject, the run goes on."""

    row: int
    line: int
    reason: str
    tokens: int


def reject_lines(row: int, line: int, reason: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The rejects file's line and the manifest's ``reject`` record of one rejected row."""
    return ({"row": row, "line": line, "reason": reason, "class": classify(reason)},
            {"type": "reject", "row": row, "reason": reason})


def row_payload(item: RowItem) -> dict[str, torch.Tensor]:
    """The contract-2 dict: input_ids int64 [seq], loss_mask int64 [seq], hidden_state [1, seq, H],
    aux_hidden_state [1, seq, K*H]."""
    return {
        "input_ids": torch.tensor(item.input_ids, dtype=torch.long),
        "loss_mask": torch.tensor(item.loss_mask, dtype=torch.long),
        "hidden_state": item.hidden_state.unsqueeze(0),
        "aux_hidden_state": item.aux_hidden_state.unsqueeze(0),
    }


def serialize(payload: dict[str, torch.Tensor]) -> bytes:
    buf = io.BytesIO()
    torch.save(payload, buf)
    return buf.getvalue()


def write_file(path: Path, data: bytes) -> int:
    """Atomically write ``data`` to ``path`` (temporary name, fsync, rename)."""
    return layout.atomic_write(path, lambda fh: fh.write(data))


@dataclass
class ChunkBook:
    """Which rows each owned chunk still waits for; builds a chunk's record once it is complete.

    Pure bookkeeping: ``expected`` maps a chunk's first row to how many rows of the dataset it
    holds (done + rejected when complete).
    """

    chunk_size: int
    expected: dict[int, int]
    recorded: set[str] = field(default_factory=set)
    _rows: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    _rejects: dict[int, int] = field(default_factory=dict)

    def name(self, start: int) -> str:
        return layout.chunk_dir_name(start, start + self.chunk_size)

    def _start(self, row: int) -> int:
        return layout.chunk_bounds(row, self.chunk_size)[0]

    def add_row(self, record: dict[str, Any]) -> None:
        self._rows.setdefault(self._start(record["row"]), []).append(record)

    def add_reject(self, row: int) -> None:
        start = self._start(row)
        self._rejects[start] = self._rejects.get(start, 0) + 1

    def completed(self) -> list[dict[str, Any]]:
        """Chunk records of chunks now complete and not yet recorded (each returned once)."""
        records = []
        for start, want in sorted(self.expected.items()):
            name = self.name(start)
            rows = self._rows.get(start, [])
            rejects = self._rejects.get(start, 0)
            if name in self.recorded or len(rows) + rejects < want:
                continue
            records.append(self._record(name, rows, rejects))
            self.recorded.add(name)
            self._rows.pop(start, None)
        return records

    @staticmethod
    def _record(name: str, rows: list[dict[str, Any]], rejects: int) -> dict[str, Any]:
        rows = sorted(rows, key=lambda r: r["row"])
        digest = hashlib.sha256("".join(r["sha256"] for r in rows).encode()).hexdigest()
        layers = list(rows[0]["stats"]) if rows else []
        stats = {layer: finish_stats([r["stats"][layer] for r in rows]) for layer in layers}
        return {"type": "chunk", "chunk": name, "rows": len(rows), "rejects": rejects,
                "tokens": sum(r["tokens"] for r in rows), "bytes": sum(r["bytes"] for r in rows),
                "sha256": digest, "stats": stats}


@dataclass
class Progress:
    """Counters shared by the writer, the heartbeat and the main loop."""

    rows_total: int = 0
    tokens_total: int = 0
    rows_done: int = 0
    tokens_done: int = 0
    bytes_done: int = 0
    rejects: int = 0
    chunks_done: int = 0
    paused: str | None = None
    rejects_by_reason: dict[str, int] = field(default_factory=dict)  # hsmon.contracts.rejects classes
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {"rows_done": self.rows_done, "rows_total": self.rows_total,
                    "tokens_done": self.tokens_done, "tokens_total": self.tokens_total,
                    "bytes_done": self.bytes_done, "rejects": self.rejects, "chunks_done": self.chunks_done,
                    "paused": self.paused, "rejects_by_reason": dict(self.rejects_by_reason)}


_STOP = object()


class RowWriter(threading.Thread):
    """Writes queued batches of rows; a bounded queue makes compute wait when disk is slow or full."""

    def __init__(self, out_dir: Path, manifest: Path, book: ChunkBook, capture_points: Sequence[int],
                 events: ev.EventWriter, progress: Progress, stop_event: threading.Event,
                 min_free: int, poll_seconds: float = 2.0, queue_batches: int = 2,
                 on_rows: Callable[[], None] | None = None, rejects_path: Path | None = None,
                 spool_room: Any | None = None) -> None:
        super().__init__(name="hsmon-writer", daemon=True)
        self.out_dir, self.manifest, self.book = out_dir, manifest, book
        self.capture_points = list(capture_points)
        self.events, self.progress, self.stop_event = events, progress, stop_event
        self.min_free, self.poll_seconds = min_free, poll_seconds
        self.on_rows = on_rows
        self.rejects_path = rejects_path or out_dir / layout.REJECTS_NAME
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=queue_batches)
        self.error: BaseException | None = None
        self.abandoned = False
        self.room = DiskRoom(out_dir, min_free, poll_seconds, events, progress, stop_event)
        # --spool-max: ``wait_for_room(n)`` waits (paused, reason spool) until n bytes fit and claims
        # them; ``recorded()`` once they are in the manifest (extractor/spool_gate.py)
        self.spool_room = spool_room
        # called with each chunk's record once it is written (extractor/first_chunk_check.py)
        self.on_chunk: Callable[[dict[str, Any]], None] | None = None

    # -- main-thread side ---------------------------------------------------------------
    def submit(self, batch: list[RowItem | RejectItem]) -> bool:
        """Queue a batch; waits while the queue is full. False if the writer can take no more."""
        while self.is_alive():
            try:
                self.queue.put(batch, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def finish(self) -> None:
        """Write what is queued (unless a stop comes during a disk pause), then end the thread."""
        while self.is_alive():
            try:
                self.queue.put(_STOP, timeout=0.2)
                break
            except queue.Full:
                continue
        self.join()

    # -- writer thread ------------------------------------------------------------------
    def run(self) -> None:
        try:
            while True:
                batch = self.queue.get()
                if batch is _STOP:
                    return
                if not self.abandoned:
                    self._write_batch(batch)
        except Abandoned:
            self.abandoned = True
            self._drain()
        except BaseException as exc:
            self.error = exc
            self._drain()

    def _drain(self) -> None:
        """Take (and drop) queued batches until finish() sends the end marker."""
        while self.queue.get() is not _STOP:
            pass

    def _write_batch(self, batch: list[RowItem | RejectItem]) -> None:
        self._write_rows([item for item in batch if isinstance(item, RowItem)])
        self._write_rejects([item for item in batch if isinstance(item, RejectItem)])
        self.write_completed_chunks()
        if self.on_rows is not None:
            self.on_rows()

    def _write_rows(self, batch: list[RowItem]) -> None:
        if not batch:
            return
        records: list[dict[str, Any]] = []
        for item in batch:
            data = serialize(row_payload(item))
            path = layout.row_path(self.out_dir, item.row, self.book.chunk_size)
            if self.spool_room is not None:  # this batch's rows so far are not in the manifest yet
                self.spool_room.wait_for_room(sum(r["bytes"] for r in records) + len(data))
            self.room.write(len(data), lambda p=path, d=data: write_file(p, d))
            records.append({"type": "row", "row": item.row, "chunk": path.parent.name,
                            "tokens": len(item.input_ids), "bytes": len(data),
                            "sha256": hashlib.sha256(data).hexdigest(),
                            "stats": row_stats(item.hidden_state, item.aux_hidden_state,
                                                self.capture_points)})
        self.append(records)
        if self.spool_room is not None:
            self.spool_room.recorded()
        for record in records:
            self.book.add_row(record)
        with self.progress.lock:
            self.progress.rows_done += len(records)
            self.progress.tokens_done += sum(r["tokens"] for r in records)
            self.progress.bytes_done += sum(r["bytes"] for r in records)
        snap = self.progress.snapshot()
        self.events.emit(ev.ROWS, rows=len(records), tokens=sum(r["tokens"] for r in records),
                         last_row=records[-1]["row"], **{k: snap[k] for k in
                                                          ("rows_done", "rows_total", "tokens_done",
                                                           "tokens_total", "bytes_done")})

    def _write_rejects(self, items: list[RejectItem]) -> None:
        """Rows the backend rejected: the rejects file, the manifest, then the counters (a row less
        to do, a reject more, by class) and a ``reject`` event each."""
        if not items:
            return
        lines = [reject_lines(i.row, i.line, i.reason) for i in items]
        self.append([file_line for file_line, _ in lines], path=self.rejects_path)
        self.append([record for _, record in lines])
        for item, (file_line, _) in zip(items, lines, strict=True):
            self.book.add_reject(item.row)
            with self.progress.lock:
                self.progress.rejects += 1
                self.progress.rows_total -= 1
                self.progress.tokens_total -= item.tokens
                by = self.progress.rejects_by_reason
                by[file_line["class"]] = by.get(file_line["class"], 0) + 1
            self.events.emit(ev.REJECT, row=item.row, line=item.line, reason=item.reason,
                             reason_class=file_line["class"])

    def record_scan_rejects(self, rejects: Sequence[Any], in_manifest: Any) -> None:
        """Rows the dataset scan rejected (already counted in the progress): those not yet in the
        manifest go to the rejects file (unless listed there), the manifest and the events."""
        layout.repair_jsonl_tail(self.rejects_path)
        listed = {r.get("row") for r in layout.iter_jsonl(self.rejects_path)}
        new = [r for r in rejects if r.index not in in_manifest]
        pairs = [reject_lines(r.index, r.line, r.reason) for r in new]
        self.append([line for r, (line, _) in zip(new, pairs, strict=True) if r.index not in listed],
                    path=self.rejects_path)
        self.append([record for _, record in pairs])
        for r in rejects:
            self.book.add_reject(r.index)
        for r, (line, _) in zip(new, pairs, strict=True):
            self.events.emit(ev.REJECT, row=r.index, line=r.line, reason=r.reason, reason_class=line["class"])

    def record_ending(self, kind: str, snap: dict[str, Any], seconds: float) -> None:
        """Append the run's ``done`` or ``stopped`` record (fsynced), so that a monitor reading only
        the output directory knows the run ended on purpose.

        A direct append: the disk reserve is for rows, not for these 200 bytes. Only a truly full
        disk refuses it; then a ``done`` waits for room like any write (paused), and a ``stopped``
        (a person wants the process gone) is left out with a line saying so.
        """
        record = {"type": kind, "ts": time.time(), "rows": snap["rows_done"], "tokens": snap["tokens_done"],
                  "bytes": snap["bytes_done"], "chunks": snap["chunks_done"], "rejects": snap["rejects"],
                  "rejects_by_reason": snap["rejects_by_reason"], "seconds": seconds}
        if kind == "stopped":
            record["reason"] = "signal"
        try:
            layout.append_jsonl(self.manifest, [record])
            return
        except OSError as exc:
            why = exc.strerror or str(exc)
        if kind == "done":
            try:
                self.append([record])  # waits (paused) for room; a stop meanwhile abandons it
                return
            except Exception as exc:  # Abandoned, or the disk error again
                why = f"{type(exc).__name__}: {exc}"
        log(f"could not record the {kind} run in {self.manifest} ({why}); "
            "the output directory will not show how the run ended")

    def write_completed_chunks(self) -> None:
        for record in self.book.completed():
            self.append([record])
            with self.progress.lock:
                self.progress.chunks_done += 1
            self.events.emit(ev.CHUNK, chunk=record["chunk"], rows=record["rows"], tokens=record["tokens"],
                             bytes=record["bytes"], rejects=record["rejects"], sha256=record["sha256"])
            if self.on_chunk is not None:
                self.on_chunk(record)

    def append(self, records: list[dict[str, Any]], path: Path | None = None) -> None:
        """Append records to the manifest (or ``path``), fsynced; waits (paused) while the disk is full."""
        if records:
            target = self.manifest if path is None else path
            self.room.write(WRITE_MARGIN_BYTES, lambda: layout.append_jsonl(target, records))

"""The regeneration's one writer: rows committed in source order, each once, whatever order they
finish in (hsmon.contracts.regen_layout).

Workers hand finished rows (`Regenerated`) and rejected ones (`Refused`) to ``put``; the writer
thread keeps those that finished ahead of the next row to commit, and commits every row that is
ready in order: the dataset file first (one fsynced append), the rejects file, then the manifest's
records (one fsynced append). A kill loses at most the rows waiting ahead of the frontier (they are
generated again on resume); a full disk pauses the commit (extractor/disk_room.py), and the run's
window of rows (extractor/regenerate/run.py) makes the workers wait meanwhile.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from extractor.disk_room import WRITE_MARGIN_BYTES, Abandoned, DiskRoom
from extractor.errors import log
from hsmon.contracts import events as ev
from hsmon.contracts import layout, regen_layout
from hsmon.contracts.regen_layout import RegenTotals
from hsmon.contracts.rejects import classify


@dataclass
class Regenerated:
    """A row whose answers are all generated: its dataset line and its manifest turns."""

    row: int
    line: int
    data: dict[str, Any]
    turns: list[dict[str, Any]]


@dataclass
class Refused:
    """A row that is not regenerated, and why (a scan's reject, a server's refusal, a cut answer)."""

    row: int
    line: int
    reason: str
    late: bool = False  # found while regenerating (not by the scan): a row less to do


@dataclass
class RegenProgress:
    """The run's counters: the committed figures (``totals``, the manifest's own fold), the plan, the
    pause flag (hsmon.contracts.pauses.Pause) and the token estimate that the ETA reads."""

    totals: RegenTotals
    rows_total: int
    prior_tokens_per_row: float  # the source answers' mean, before any row is regenerated
    paused: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def snapshot(self) -> dict[str, Any]:
        """The figures every event carries (cumulative: a reader may start anywhere)."""
        with self.lock:
            t = self.totals
            per_row = t.answer_tokens / t.rows if t.rows else self.prior_tokens_per_row
            left = max(0, self.rows_total - t.rows)
            return {"rows_done": t.rows, "rows_total": self.rows_total, "tokens_done": t.answer_tokens,
                    "tokens_total": round(t.answer_tokens + left * per_row), "bytes_done": t.end,
                    "rejects": t.rejects, "rejects_by_reason": dict(t.reject_classes), "paused": self.paused,
                    "answers": t.answers, "finish": dict(t.finish), "truncated": t.truncated_rows,
                    "compared_answers": t.compared_answers, "compared_tokens": t.compared_tokens,
                    "source_tokens": t.source_tokens}


_STOP = object()


class OrderedWriter(threading.Thread):
    """Commits finished rows in source order from ``next_row`` on (see the module's docstring)."""

    def __init__(self, out: Path, next_row: int, progress: RegenProgress, events: ev.EventWriter,
                 stop_event: threading.Event, min_free: int, poll_seconds: float,
                 on_commit: Callable[[int], None] | None = None) -> None:
        super().__init__(name="hsmon-regenerate-writer", daemon=True)
        self.out, self.next_row, self.progress, self.events = out, next_row, progress, events
        self.data_path = out / regen_layout.DATA_NAME
        self.manifest = out / regen_layout.MANIFEST_NAME
        self.rejects_path = out / regen_layout.REJECTS_NAME
        self.room = DiskRoom(out, min_free, poll_seconds, events, progress, stop_event)
        self.on_commit = on_commit  # called with the next row to commit (the run's window)
        self.on_rows: Callable[[], None] | None = None  # called after each commit (the progress line)
        self.queue: queue.Queue[Any] = queue.Queue()
        self.waiting: dict[int, Regenerated | Refused] = {}
        self.error: BaseException | None = None
        self.abandoned = False
        self._listed = {r.get("row") for r in layout.iter_jsonl(self.rejects_path)}  # from an earlier run

    def put(self, item: Regenerated | Refused) -> None:
        self.queue.put(item)

    def finish(self) -> None:
        """Commit what is ready in order, drop what waits behind a gap, end the thread."""
        self.queue.put(_STOP)
        self.join()

    def run(self) -> None:
        try:
            while True:
                item = self.queue.get()
                if item is _STOP:
                    return
                if self.abandoned or self.error is not None:
                    continue
                self.waiting[item.row] = item
                while not self.queue.empty():  # take what else finished meanwhile: fewer, larger commits
                    more = self.queue.get_nowait()
                    if more is _STOP:
                        self._commit_ready()
                        return
                    self.waiting[more.row] = more
                self._commit_ready()
        except Abandoned:
            self.abandoned = True
        except BaseException as exc:
            self.error = exc

    def _commit_ready(self) -> None:
        ready: list[Regenerated | Refused] = []
        while self.next_row in self.waiting:
            ready.append(self.waiting.pop(self.next_row))
            self.next_row += 1
        if ready:
            self.commit(ready)

    def commit(self, items: list[Regenerated | Refused]) -> None:
        """Write ``items`` (consecutive rows, in order): dataset, rejects file, manifest; then the
        counters and the events."""
        lines, records, refused = [], [], []
        end = self.progress.totals.end
        for item in items:
            if isinstance(item, Regenerated):
                line = (json.dumps(item.data, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
                lines.append(line)
                end += len(line)
                records.append({"type": "row", "row": item.row, "line": item.line, "end": end,
                                "turns": item.turns})
            else:
                refused.append({"row": item.row, "line": item.line, "reason": item.reason,
                                "class": classify(item.reason)})
                records.append({"type": "reject", "row": item.row, "reason": item.reason})
        data = b"".join(lines)
        self.room.write(len(data), lambda: layout.append_bytes(self.data_path, data))
        new = [r for r in refused if r["row"] not in self._listed]
        if new:
            self.room.write(WRITE_MARGIN_BYTES, lambda: layout.append_jsonl(self.rejects_path, new))
        self.room.write(WRITE_MARGIN_BYTES, lambda: layout.append_jsonl(self.manifest, records))
        with self.progress.lock:
            for record in records:
                self.progress.totals.add(record)
            self.progress.rows_total -= sum(1 for i in items if isinstance(i, Refused) and i.late)
        self._emit(records, refused)
        if self.on_commit is not None:
            self.on_commit(self.next_row)
        if self.on_rows is not None:
            self.on_rows()

    def _emit(self, records: list[dict[str, Any]], refused: list[dict[str, Any]]) -> None:
        for reject in refused:
            self.events.emit(ev.REJECT, row=reject["row"], line=reject["line"], reason=reject["reason"],
                             reason_class=reject["class"])
        rows = [r for r in records if r["type"] == "row"]
        if rows:
            snap = self.progress.snapshot()
            snap.pop("paused")
            tokens = sum(t.get("tokens", 0) for r in rows for t in r["turns"])
            self.events.emit(ev.ROWS, rows=len(rows), tokens=tokens, last_row=rows[-1]["row"], **snap)

    def record_ending(self, kind: str, seconds: float) -> None:
        """The run's ``done`` or ``stopped`` record (fsynced): a reader of the output alone knows it
        ended on purpose. A ``done`` waits for room like any write; a ``stopped`` is left out, said
        in a line, when the disk is truly full (a person wants the process gone)."""
        snap = self.progress.snapshot()
        record = {"type": kind, "ts": time.time(), "rows": snap["rows_done"], "tokens": snap["tokens_done"],
                  "rejects": snap["rejects"], "rejects_by_reason": snap["rejects_by_reason"],
                  "seconds": seconds}
        if kind == "stopped":
            record["reason"] = "signal"
        try:
            if kind == "done":
                self.room.write(WRITE_MARGIN_BYTES, lambda: layout.append_jsonl(self.manifest, [record]))
            else:
                layout.append_jsonl(self.manifest, [record])
        except (OSError, Abandoned) as exc:
            log(f"could not record the {kind} run in {self.manifest} ({type(exc).__name__}: {exc}); the "
                "output directory will not show how the run ended")

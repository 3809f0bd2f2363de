"""The following trainer's data: complete chunks read from a spool as they appear, and the replay
window its batches are drawn from (`hsmon train SPOOL --follow --passes E`; docs/train.md "Online").

`SpoolSource` tails every manifest of the spool (the layout contract) and hands over a chunk only once its
``chunk`` record is written (every row of it is on disk and counted; a partial chunk is never
read). It holds the row records of open chunks only (at most a chunk per shard). The extraction
has ended when every shard's manifest ends its latest run with ``done``.

`Window`: every training row enters with E tickets. The window is the oldest ``size`` rows (in
arrival order) that still hold tickets; a batch is drawn uniformly among them (a random sample,
sorted by length, a run of similar lengths grown both ways from a random anchor while it fits the
token budget: little padding, and no length waits longer than another); each row
drawn gives up one ticket when its step is taken. A row is therefore in exactly E batches, spread
over about E x size / rows-per-batch steps, and rows leave in about the order they came, so
chunks finish (and with --consume leave the spool) in order.
"""

from __future__ import annotations

import os
import random
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hsmon.contracts import layout
from hsmon.contracts.heldout import HeldOut
from hsmon.contracts.manifest_reader import JsonlTail
from hsmon.contracts.spool_fill import RowBytes
from trainer.data import RowRef, check_chunk_name, load_row
from trainer.nonfinite import row_stats_nonfinite, tensors_finite


@dataclass
class ChunkRows:
    """A complete chunk: its training rows, held-out rows, rows left out for NaN/Inf, and bytes."""

    name: str
    train: list[RowRef] = field(default_factory=list)
    held: list[RowRef] = field(default_factory=list)
    nonfinite: list[int] = field(default_factory=list)
    train_bytes: int = 0


class SpoolSource:
    """Complete chunks of a spool, as they appear (one reader: rank 0)."""

    def __init__(self, data_dir: Path, max_length: int | None, heldout: HeldOut) -> None:
        self.data_dir, self.max_length, self.heldout = Path(data_dir), max_length, heldout
        self._tails: dict[str, JsonlTail] = {}
        self._runs: dict[str, layout.RunLog] = {}
        self._open: dict[str, dict[int, dict[str, Any]]] = {}
        self._seen: set[str] = set()
        self._new: list[ChunkRows] = []
        self.written = RowBytes()  # every row the manifests count (open chunks too), for the spool's level

    def poll(self) -> list[ChunkRows]:
        """Chunks completed since the last poll (every manifest read to its end)."""
        for path in layout.manifest_paths(self.data_dir):
            key = str(path)
            if key not in self._tails:
                self._tails[key], self._runs[key] = JsonlTail(key), layout.RunLog()
            run = self._runs[key]

            def handle(record: dict[str, Any], run: layout.RunLog = run, key: str = key) -> None:
                check_chunk_name(record, key)
                run.add(record)
                self._add(record)

            self._tails[key].poll(handle)
        new, self._new = self._new, []
        return new

    def ended(self) -> bool:
        """Every shard's manifest ends its latest run with ``done`` (read by the last poll)."""
        summary = layout.summarize_runs(self._runs.values())
        return summary["ending"] == "done" and summary["shards_missing"] == 0

    def plan_rows(self) -> int | None:
        """Rows the extraction plans (every shard's run record), None when a manifest has no plan."""
        summary = layout.summarize_runs(self._runs.values())
        total = summary["rows_total"]
        return int(total) if isinstance(total, int) and summary["shards_missing"] == 0 else None

    def _add(self, record: dict[str, Any]) -> None:
        kind, chunk = record.get("type"), record.get("chunk")
        if not isinstance(chunk, str) or chunk in self._seen:
            return
        if kind == "row" and isinstance(record.get("row"), int):
            rows = self._open.setdefault(chunk, {})
            if record["row"] not in rows:
                rows[record["row"]] = record
            self.written.add(record)
        elif kind == "chunk":
            self._seen.add(chunk)
            self._new.append(self._complete(chunk, self._open.pop(chunk, {})))

    def _complete(self, chunk: str, records: dict[int, dict[str, Any]]) -> ChunkRows:
        out = ChunkRows(chunk)
        base = str(self.data_dir / chunk) + os.sep
        for row in sorted(records):
            rec = records[row]
            tokens = int(rec.get("tokens") or 0)
            length = tokens if self.max_length is None else min(tokens, self.max_length)
            if length < 2:
                continue
            ref = RowRef(base + layout.row_file_name(row), row, length)
            bad = row_stats_nonfinite(rec.get("stats"))
            if bad is None:  # a record without stats: its tensors are checked once, here
                bad = not tensors_finite(load_row(ref.path))
            if bad:
                out.nonfinite.append(row)
                continue
            if self.heldout.holds(row):
                out.held.append(ref)
            else:
                out.train.append(ref)
                out.train_bytes += int(rec.get("bytes") or 0)
        return out


@dataclass
class ChunkState:
    """A chunk in the window: its rows still short of E passes, and whether it left the spool."""

    rows: ChunkRows
    short: int  # training rows with fewer than E passes
    consumed: bool = False


class Window:
    """The replay window (see the module's docstring). Every rank holds an identical one."""

    def __init__(self, passes: int, size: int, done: dict[int, int] | None = None) -> None:
        self.passes_target, self.size = passes, size
        self.passes: dict[int, int] = dict(done or {})  # every row's passes, from the ledger on
        self.pending: dict[int, int] = {}  # passes given since the last ``trained`` record
        self.chunks: dict[str, ChunkState] = {}
        self._chunk_of: dict[int, str] = {}
        self._queue: deque[RowRef] = deque()
        self.active: list[RowRef] = []
        self.held: list[RowRef] = []
        self.nonfinite: list[int] = []
        self.rows_seen = 0

    def add(self, chunk: ChunkRows, consumed: bool = False) -> None:
        """Admit a complete chunk (``consumed``: the ledger says it left the spool already)."""
        if chunk.name in self.chunks:
            return
        self.held += chunk.held
        self.nonfinite += chunk.nonfinite
        self.rows_seen += len(chunk.train)
        short = [r for r in chunk.train if self.passes.get(r.row, 0) < self.passes_target]
        self.chunks[chunk.name] = ChunkState(chunk, 0 if consumed else len(short), consumed)
        if consumed:
            return
        for ref in short:
            self._chunk_of[ref.row] = chunk.name
            self._queue.append(ref)
        self._refill()

    def _refill(self) -> None:
        while len(self.active) < self.size and self._queue:
            self.active.append(self._queue.popleft())

    def tickets(self) -> int:
        """Passes still to give to the rows on hand."""
        return sum(self.passes_target - self.passes.get(r.row, 0) for r in (*self.active, *self._queue))

    def ticket_tokens(self) -> int:
        return sum(r.length for r in (*self.active, *self._queue))

    def draw(self, rng: random.Random, batch_tokens: int, world: int) -> list[list[RowRef]]:
        """One step's batches, one per rank (distinct rows; a rank may get none when rows run short).

        Each batch: a random anchor among (up to 64 per rank of) the window's rows, sorted by
        length, grown outward to the neighbour closest in length while it fits ``batch_tokens``
        padded tokens. Growing both ways keeps the shortest and longest rows from waiting longer
        than the others."""
        picked = rng.sample(self.active, min(len(self.active), 64 * world))
        pool = sorted(picked, key=lambda r: (r.length, r.row))
        batches: list[list[RowRef]] = []
        for _ in range(world):
            if not pool:
                batches.append([])
                continue
            lo = hi = rng.randrange(len(pool))
            longest = pool[lo].length
            while True:
                left = pool[lo - 1] if lo > 0 else None
                right = pool[hi + 1] if hi + 1 < len(pool) else None
                if left is None and right is None:
                    break
                anchor = pool[lo].length
                take_left = right is None or (left is not None and (
                    anchor - left.length, rng.random()) < (right.length - pool[hi].length, rng.random()))
                ref = left if take_left else right
                assert ref is not None
                if max(longest, ref.length) * (hi - lo + 2) > batch_tokens:
                    break
                longest = max(longest, ref.length)
                lo, hi = (lo - 1, hi) if take_left else (lo, hi + 1)
            batches.append(pool[lo:hi + 1])
            pool = pool[:lo] + pool[hi + 1:]
        return batches

    def credit(self, rows: list[int]) -> None:
        """Each row of a taken step (one that updated the weights) gives up one ticket; rows at E leave
        the window. A step skipped for non-finite values credits nothing: its rows are drawn again."""
        finished: set[int] = set()
        for row in rows:
            self.passes[row] = self.passes.get(row, 0) + 1
            self.pending[row] = self.pending.get(row, 0) + 1
            if self.passes[row] >= self.passes_target:
                finished.add(row)
                self.chunks[self._chunk_of[row]].short -= 1
        if finished:
            self.active = [r for r in self.active if r.row not in finished]
            self._refill()

    def take_pending(self) -> dict[int, int]:
        pending, self.pending = self.pending, {}
        return pending

    def finished_chunks(self) -> list[ChunkState]:
        """Chunks whose every training row has had its E passes and that are still in the spool."""
        return [c for c in self.chunks.values() if not c.consumed and c.short == 0]

    def passes_total(self) -> int:
        return sum(self.passes.values())

"""How full an online spool (the spool contract, hsmon.contracts.spool) is, read incrementally.

The bytes waiting in a spool are the bytes of the rows every manifest of the directory records
(one per extraction shard) minus the bytes the following trainer's ledger says were consumed.
`SpoolFill` keeps both as running totals: each poll reads only what the manifests and the ledger
gained (an idle poll is one ``stat`` per file; the directory is listed again for new shard
manifests at most every ``rescan_s``), and per row it keeps one bit (a row recorded twice, by a
resumed run, counts once). `hsmon extract --spool-max` polls it before each row it writes.

No heavy imports here: the monitor imports this module.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hsmon.contracts import layout
from hsmon.contracts.manifest_reader import JsonlTail, RowSet
from hsmon.contracts.spool import Ledger, LedgerReader, waiting_bytes


@dataclass
class SpoolLevel:
    """One reading of a spool: the manifests' row bytes and rows, the ledger's consumed bytes and
    rows, and what is waiting (row bytes minus consumed bytes)."""

    row_bytes: int
    rows: int
    consumed_bytes: int
    consumed_rows: int
    waiting_bytes: int
    ledger: Ledger


@dataclass
class _RowBytes:
    """One manifest's row records as running totals (a row counted once)."""

    rows: RowSet = field(default_factory=RowSet)
    bytes: int = 0

    def add(self, record: dict[str, Any]) -> None:
        if record.get("type") != "row":
            return
        row, size = record.get("row"), record.get("bytes")
        if isinstance(row, int) and not isinstance(row, bool) and self.rows.add(row):
            self.bytes += size if isinstance(size, int) and size > 0 else 0


class SpoolFill:
    """The spool's level, read incrementally (see the module's docstring)."""

    def __init__(self, out_dir: str | os.PathLike[str], rescan_s: float = 5.0) -> None:
        self.out = Path(out_dir)
        self.rescan_s = rescan_s
        self._manifests: dict[str, tuple[JsonlTail, _RowBytes]] = {}
        self._listed_at: float | None = None
        self._ledger = LedgerReader(out_dir, track_passes=False)

    def poll(self, now: float | None = None) -> SpoolLevel:
        now = time.monotonic() if now is None else now
        if self._listed_at is None or now - self._listed_at >= self.rescan_s:
            self._listed_at = now
            for path in layout.manifest_paths(self.out):
                self._manifests.setdefault(str(path), (JsonlTail(str(path)), _RowBytes()))
        for name, (tail, totals) in list(self._manifests.items()):
            _, reset = tail.poll(totals.add)
            if reset:  # replaced or truncated: count it again
                fresh = _RowBytes()
                tail.poll(fresh.add)
                self._manifests[name] = (tail, fresh)
        ledger = self._ledger.poll()
        row_bytes = sum(t.bytes for _, t in self._manifests.values())
        rows = sum(len(t.rows) for _, t in self._manifests.values())
        return SpoolLevel(row_bytes, rows, ledger.consumed_bytes, ledger.consumed_rows,
                          waiting_bytes(row_bytes, ledger), ledger)

"""The spool contract's writing side: the following trainer's ledger (hsmon.contracts.spool), one writer.

`LedgerWriter` appends records to SPOOL/hsmon-ledger.jsonl, each append one ``write`` then an
``fsync`` (the durability point, as the manifest's), after cutting a partial last line that a
``kill -9`` mid-append left (``layout.repair_jsonl_tail``). Readers (``spool.LedgerReader``) skip
a partial line, so a record is either whole and durable or absent.

`first_start` reads the ledger's first ``start`` record: the rules fixed at the first start (the
held-out rule, the passes) that a resumed trainer keeps.

No heavy imports here: the monitor may import this module.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from hsmon.contracts import layout, spool


class LedgerWriter:
    """The ledger's single writer (rank 0 of the following trainer)."""

    def __init__(self, out_dir: str | os.PathLike[str]) -> None:
        self.path = spool.ledger_path(out_dir)
        layout.repair_jsonl_tail(self.path)

    def append(self, kind: str, **fields: Any) -> dict[str, Any]:
        record = {"type": kind, "ts": round(time.time(), 3), **fields}
        layout.append_jsonl(self.path, [record], fsync=True)
        return record

    def start(self, *, passes: int, consume: bool, step: int, heldout: dict[str, Any],
              **fields: Any) -> dict[str, Any]:
        return self.append("start", pid=os.getpid(), passes=passes, consume=consume, step=step,
                           heldout=heldout, **fields)

    def trained(self, step: int, rows: dict[int, int], save: int | None = None) -> dict[str, Any] | None:
        """Passes given since the previous trained record; written before the checkpoint of ``step``
        (``save``: that checkpoint's save number, which a resume's ``start`` names)."""
        if not rows:
            return None
        extra = {} if save is None else {"save": save}
        return self.append("trained", step=step, rows={str(r): n for r, n in sorted(rows.items())}, **extra)

    def skipped(self, step: int, rows: int) -> dict[str, Any]:
        """A step skipped for non-finite values: its ``rows`` rows had no pass (the weights did not
        move); they are drawn again."""
        return self.append("skipped", step=step, rows=rows)

    def consumed(self, chunk: str, rows: int, nbytes: int) -> dict[str, Any]:
        """Written before the chunk's files are deleted (a kill between the two leaves files that
        the next start deletes: the record, not the files, says what is consumed)."""
        return self.append("consumed", chunk=chunk, rows=rows, bytes=nbytes)

    def ended(self, kind: str, step: int, **fields: Any) -> dict[str, Any]:
        assert kind in ("done", "stopped"), kind
        return self.append(kind, step=step, **fields)


def first_start(out_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The ledger's first ``start`` record (None when there is no ledger or no start in it)."""
    path = Path(spool.ledger_path(out_dir))
    if not path.is_file():
        return None
    for record in layout.iter_jsonl(path):
        if record.get("type") == "start":
            return record
    return None

"""How full an online spool (the spool contract, hsmon.contracts.spool) is: the one computation
that the extractor's gate, the following trainer and the monitor all use.

The bytes waiting in a spool are the bytes of the rows every manifest of the directory records
(one per extraction shard; a row recorded twice, by a resumed run, counts once) minus the bytes
the following trainer's ledger says were consumed. `level` turns those figures and the limit into
a `SpoolLevel`, which answers whether the next row fits (`room_for`), whether the spool is full
(no room for a row of the average size) and whether it is half full (the trainer saves early).
`RowBytes` is the running total of a manifest's row records (the trainer feeds it the records it
reads anyway; the monitor's manifest reader keeps the same totals).

`SpoolFill` (the extractor's gate, tests) keeps both as running totals read from the files: each
poll reads only what the manifests and the ledger gained (an idle poll is one ``stat`` per file;
the directory is listed again for new shard manifests at most every ``rescan_s``), and per row it
keeps one bit. `hsmon extract --spool-max` polls it before each row it writes.

`SpoolClaims`: the shards that share a spool write rows before their manifests record them; each
writer claims the bytes of its rows not yet recorded (SPOOL/.hsmon-spool-claim-<manifest>, a
20-digit number rewritten in place) while it holds SPOOL/.hsmon-spool.lock (flock), and counts the
other writers' claims with the manifests (a claim's manifest is read at once, not at the next
listing). So two shards never both take the last room. A writer
killed between its row and its record leaves its claim until it starts again (the others wait
for a row's bytes more than they need: safe). Hidden names: the monitor's readers skip them.

No heavy imports here: the monitor imports this module.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hsmon.contracts import layout, nofollow
from hsmon.contracts.manifest_reader import JsonlTail, RowSet
from hsmon.contracts.spool import Ledger, LedgerReader


@dataclass(frozen=True)
class SpoolLevel:
    """One reading of a spool: the manifests' row bytes and rows, the consumed bytes and rows, what
    is waiting (row bytes minus consumed bytes) and the limit (None: unbounded, or not known)."""

    row_bytes: int
    rows: int
    consumed_bytes: int
    consumed_rows: int
    waiting_bytes: int
    limit_bytes: int | None = None

    def room_for(self, need: int) -> bool:
        """Whether a row of ``need`` bytes may be written now: it fits below the limit, or the
        spool is empty (a row larger than the limit cannot stop the run)."""
        return (self.limit_bytes is None or self.waiting_bytes == 0
                or self.waiting_bytes + need <= self.limit_bytes)

    @property
    def full(self) -> bool:
        """No room for a row of the average size written so far."""
        return self.rows > 0 and not self.room_for(self.row_bytes // self.rows)

    @property
    def half_full(self) -> bool:
        """The rows waiting hold half the limit or more."""
        return self.limit_bytes is not None and self.waiting_bytes * 2 >= self.limit_bytes


def level(row_bytes: int, rows: int, consumed_bytes: int, consumed_rows: int,
          limit_bytes: int | None) -> SpoolLevel:
    """The spool's level from the manifests' row totals and the consumed totals."""
    waiting = max(0, row_bytes - consumed_bytes)
    return SpoolLevel(row_bytes, rows, consumed_bytes, consumed_rows, waiting, limit_bytes)


def ledger_level(row_bytes: int, rows: int, ledger: Ledger, limit_bytes: int | None) -> SpoolLevel:
    """The level from the manifests' row totals and a ledger's consumed totals."""
    return level(row_bytes, rows, ledger.consumed_bytes, ledger.consumed_rows, limit_bytes)


@dataclass
class RowBytes:
    """Row records as running totals (a row counted once)."""

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
        self._manifests: dict[str, tuple[JsonlTail, RowBytes]] = {}
        self._listed_at: float | None = None
        self._ledger = LedgerReader(out_dir, track_passes=False)
        self.ledger: Ledger = self._ledger.ledger

    def poll(self, now: float | None = None, limit_bytes: int | None = None, claimed: int = 0,
             manifests: Iterable[str] = ()) -> SpoolLevel:
        """The level now; ``claimed``: bytes of rows written and not yet in a manifest (other
        shards'); ``manifests``: names of manifests known to be written (listed now if not seen yet)."""
        now = time.monotonic() if now is None else now
        unseen = any(str(self.out / name) not in self._manifests for name in manifests)
        if unseen or self._listed_at is None or now - self._listed_at >= self.rescan_s:
            self._listed_at = now
            for path in layout.manifest_paths(self.out):
                self._manifests.setdefault(str(path), (JsonlTail(str(path)), RowBytes()))
        for name, (tail, totals) in list(self._manifests.items()):
            _, reset = tail.poll(totals.add)
            if reset:  # replaced or truncated: count it again
                fresh = RowBytes()
                tail.poll(fresh.add)
                self._manifests[name] = (tail, fresh)
        self.ledger = self._ledger.poll()
        row_bytes = sum(t.bytes for _, t in self._manifests.values())
        rows = sum(len(t.rows) for _, t in self._manifests.values())
        return ledger_level(row_bytes + claimed, rows, self.ledger, limit_bytes)


CLAIM_PREFIX = ".hsmon-spool-claim-"
LOCK_NAME = ".hsmon-spool.lock"


class SpoolClaims:
    """The bytes each writer of a shared spool has written and not yet recorded (see the module's
    docstring); POSIX only (fcntl)."""

    def __init__(self, out_dir: str | os.PathLike[str], manifest_name: str) -> None:
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.own = self.out / f"{CLAIM_PREFIX}{manifest_name}"
        self.writers: list[str] = []  # the other writers' manifest names (by the last ``others``)
        self._lock_fd = nofollow.open_file(self.out / LOCK_NAME, os.O_CREAT | os.O_RDWR)
        self._fd = nofollow.open_file(self.own, os.O_CREAT | os.O_RDWR | os.O_TRUNC)
        self.set(0)

    @contextmanager
    def locked(self) -> Iterator[None]:
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def others(self) -> int:
        """The other writers' claims (call while locked); ``writers`` then names their manifests."""
        total = 0
        self.writers = []
        for path in self.out.glob(f"{CLAIM_PREFIX}*"):
            if path == self.own:
                continue
            self.writers.append(path.name[len(CLAIM_PREFIX):])
            try:
                total += int(path.read_bytes().strip() or 0)
            except (OSError, ValueError):
                continue
        return total

    def set(self, claimed: int) -> None:
        """This writer's claim (call while locked, or before any other writer can read it)."""
        os.pwrite(self._fd, b"%20d\n" % claimed, 0)

    def close(self) -> None:
        for fd in (self._fd, self._lock_fd):
            with suppress(OSError):
                os.close(fd)

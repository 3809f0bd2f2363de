"""Whether a --spool-max can deadlock, by the worst case's arithmetic (`hsmon extract --spool-max`).

Both sides wait for ever when the spool is full and the following trainer can consume nothing:
it consumes whole chunks only, once every training row of a chunk has had its passes, and some
rows never leave the spool at all. So the smallest limit that cannot deadlock holds

* the rows that never leave: the rows the trainer holds out for evaluation (the rule its ledger
  records, or before any trainer started its default: hsmon.contracts.heldout; exact for this
  shard's rows, at this shard's mean row size for the other shards') and rows too short to train
  on (under two tokens). Rows left out for NaN/Inf values cannot be known before they are made:
  the monitor pages a spool that fills while the trainer waits;
* one chunk per shard that shares the spool, each up to its largest chunk (every shard may be
  partway through one when the spool fills, and the next row of this shard completes its own).

`check_limit` refuses a smaller limit in one line naming that smallest limit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extractor.errors import UsageError
from extractor.plan import Shard
from hsmon.contracts.heldout import HeldOut, is_held_out
from hsmon.contracts.spool_ledger import first_start
from hsmon.contracts.units import format_bytes

MIN_TRAIN_TOKENS = 2  # a row under this many tokens has no next-token target: the trainer skips it


@dataclass(frozen=True)
class SpoolNeed:
    """The bytes a spool must hold so that it cannot deadlock (see the module's docstring)."""

    held_rows: int
    held_bytes: int
    short_rows: int
    short_bytes: int
    chunk_bytes: int  # this shard's largest chunk
    shards: int

    @property
    def never_leave(self) -> int:
        return self.held_bytes + self.short_bytes

    @property
    def total(self) -> int:
        return self.never_leave + self.chunk_bytes * self.shards


def heldout_rule(out: Path) -> HeldOut:
    """The rule of the trainer that follows this spool (its ledger's first start), else the default."""
    start = first_start(out)
    rule = start.get("heldout") if start else None
    return HeldOut.from_record(rule) if isinstance(rule, dict) else HeldOut.new()


def round_up(n: int) -> int:
    """``n`` rounded up to what format_bytes shows (0.1 of its unit), so "at least" is enough."""
    scale = 1
    while n >= 1000 * scale and scale < 10**12:
        scale *= 1000
    step = scale // 10 if scale > 1 else 1
    return -(-n // step) * step


def spool_need(scan: Any, bytes_of: Callable[[int], int], chunk_size: int, shard: Shard,
               heldout: HeldOut) -> SpoolNeed:
    """The worst case of this shard's rows (all of them: a resume's rows already written are in the
    spool too) and, for the held-out rows of the other shards, their count at this shard's mean
    size. ``scan``: the dataset's scan (rows owned, their lengths, the dataset's lines)."""
    rows: Sequence[int] = scan.rows or ()
    lengths: Sequence[int] = scan.lengths or ()
    lines: int = scan.lines
    held = held_bytes = short = short_bytes = total = 0
    chunks: dict[int, int] = {}
    for row, length in zip(rows, lengths, strict=True):
        size = bytes_of(length)
        total += size
        chunks[row // chunk_size] = chunks.get(row // chunk_size, 0) + size
        if heldout.holds(row):
            held, held_bytes = held + 1, held_bytes + size
        elif length < MIN_TRAIN_TOKENS:
            short, short_bytes = short + 1, short_bytes + size
    if shard.count > 1 and rows and heldout.fraction > 0:
        mean = total // len(rows)
        others = sum(1 for i in range(min(heldout.below_row, lines))
                     if not shard.owns_row(i, chunk_size) and is_held_out(i, heldout.fraction))
        held, held_bytes = held + others, held_bytes + others * mean
    return SpoolNeed(held, held_bytes, short, short_bytes, max(chunks.values(), default=0), shard.count)


def check_limit(spool_max: int, need: SpoolNeed, chunk_size: int) -> None:
    """Refuse a limit under the smallest one that cannot deadlock, in one line naming it."""
    if spool_max >= need.total or need.chunk_bytes == 0:
        return
    stay = [f"{need.held_rows} held out for evaluation"] if need.held_rows else []
    stay += [f"{need.short_rows} under {MIN_TRAIN_TOKENS} tokens"] if need.short_rows else []
    never = (f"rows that never leave it take ~{format_bytes(need.never_leave)} ({', '.join(stay)}), "
             if stay else "")
    per = f" per shard x {need.shards} shards" if need.shards > 1 else ""
    least = format_bytes(round_up(need.total))
    raise UsageError(
        f"--spool-max {format_bytes(spool_max)} can fill the spool for ever: {never}and the trainer "
        f"consumes whole chunks only (up to ~{format_bytes(need.chunk_bytes)} at --chunk-size {chunk_size}"
        f"{per}); give --spool-max of at least {least} or a smaller --chunk-size")

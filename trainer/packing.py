"""How the following trainer packs a step's batches from its replay window (trainer/window.py).

A window on a bounded spool holds few rows (a 10 % spool of a small dataset: 15-30), so a batch
grown from a random row to its neighbours in length leaves much of ``batch_tokens`` as padding or
unused, and a row's turn depended on chance. Here each batch is

- **anchored on the row that has waited longest** since it was last drawn (or since it entered the
  window; ties: the earlier arrival): every row is drawn at least once every ``len(window)``
  batches, whatever its length, so its E passes are spread evenly and rows leave in about the order
  they came (no length waits behind the others);
- **filled as densely as the window allows around that anchor**: for every cap L (the anchor's
  length or a longer row's), the batch is the anchor plus the longest other rows no longer than L,
  as many as fit (n = batch_tokens // L rows in all); the cap whose batch holds the most real tokens
  wins (ties: the smaller cap, less padding). Among rows of one length the longest-waiting go first;
  a row longer than ``batch_tokens`` trains alone (as offline: always at least one row).

Every rank computes the same batches (same window, same order): one batch per rank, distinct rows.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from trainer.data import RowRef


@dataclass(frozen=True)
class Candidate:
    """A row on hand: when it was last drawn (or entered) and its arrival order (the tie-break)."""

    ref: RowRef
    last: int
    arrival: int


def densest_batch(anchor: Candidate, others: Sequence[Candidate], batch_tokens: int) -> list[Candidate]:
    """The anchor plus the other rows that give the most real tokens within ``batch_tokens`` padded
    tokens (see the module's docstring). ``others`` need not be sorted."""
    if anchor.ref.length >= batch_tokens:
        return [anchor]
    # by length; within a length the longest-waiting last, so that a slice's end takes them first
    pool = sorted(others, key=lambda c: (c.ref.length, -c.last, -c.arrival))
    lengths = [c.ref.length for c in pool]
    prefix = [0, *accumulate(lengths)]
    caps = sorted({anchor.ref.length} | {n for n in lengths if anchor.ref.length < n <= batch_tokens})
    best: tuple[int, int, int] | None = None  # (tokens, -cap, rows below the cap)
    for cap in caps:
        fit = batch_tokens // cap - 1  # other rows beside the anchor
        below = bisect.bisect_right(lengths, cap)
        take = min(fit, below)
        tokens = anchor.ref.length + prefix[below] - prefix[below - take]
        if best is None or (tokens, -cap) > best[:2]:
            best = (tokens, -cap, below)
    assert best is not None
    below = best[2]
    take = min(batch_tokens // -best[1] - 1, below)
    return [anchor, *pool[below - take:below]]


def pack(candidates: Sequence[Candidate], batch_tokens: int, batches: int) -> list[list[RowRef]]:
    """``batches`` batches of distinct rows (one per rank; empty when rows run short), each anchored
    on the longest-waiting row left and filled by densest_batch."""
    left = sorted(candidates, key=lambda c: (c.last, c.arrival))
    out: list[list[RowRef]] = []
    for _ in range(batches):
        if not left:
            out.append([])
            continue
        chosen = densest_batch(left[0], left[1:], batch_tokens)
        taken = {id(c) for c in chosen}
        left = [c for c in left if id(c) not in taken]
        out.append(sorted((c.ref for c in chosen), key=lambda r: (r.length, r.row)))
    return out

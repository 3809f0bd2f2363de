"""Which rows a trainer holds out for evaluation: the offline trainer's hash split and the following
trainer's rule (fixed at its first start and recorded in the spool's ledger, hsmon.contracts.spool).

Held-out rows are never consumed, so in an online spool they stay until the end: the extractor
counts them when it checks a --spool-max (extractor/spool_limit.py), with the rule the ledger
records or, before any trainer started, the trainer's default.

No heavy imports here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# `hsmon train --eval-fraction`'s default: the share of rows held out
DEFAULT_EVAL_FRACTION = 0.05
# the following trainer's cap on held-out rows: rows from ``below_row`` on are never held out
DEFAULT_HELDOUT_ROWS = 256


def is_held_out(row: int, eval_fraction: float) -> bool:
    """Deterministic split by row number (a resumed or re-run training sees the same split)."""
    return ((row * 2654435761) % 2**32) / 2**32 < eval_fraction


@dataclass(frozen=True)
class HeldOut:
    """The following trainer's rule that chooses evaluation rows, fixed at its first start (the
    ledger's ``heldout``): row i is held out when i < below_row and hash(i) falls under
    ``fraction`` (`is_held_out`, the offline trainer's hash)."""

    fraction: float
    below_row: int

    @classmethod
    def new(cls, fraction: float = DEFAULT_EVAL_FRACTION, max_rows: int = DEFAULT_HELDOUT_ROWS) -> HeldOut:
        below = math.ceil(max_rows / fraction) if fraction > 0 else 0
        return cls(fraction, below)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> HeldOut:
        return cls(float(record.get("fraction", 0.0)), int(record.get("below_row", 0)))

    def to_record(self) -> dict[str, Any]:
        return {"rule": "hash", "fraction": self.fraction, "below_row": self.below_row}

    def holds(self, row: int) -> bool:
        return self.fraction > 0 and row < self.below_row and is_held_out(row, self.fraction)

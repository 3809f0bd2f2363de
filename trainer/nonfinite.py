"""The trainer's guard against non-finite data and a diverging loss.

Rows: the manifest's per-row ``stats`` (the layout contract: ``[tokens, sum_l2, count, sum, sumsq,
max_abs, nonfinite]`` per layer) say whether a row holds NaN/Inf without reading it; a row
without stats (a plain SpecForge layout, an older manifest) has its tensors checked once, when
the data index is built. Such rows are left out of training and counted.

Steps: a loss (or gradient norm) that is not finite anyway skips that step; ``LossGuard`` counts
the skips and ends the run with one clear line after ``max_in_a_row`` of them in a row;
``backward_unless_nonfinite`` and ``skip_step`` are the training loop's two calls.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hsmon.contracts import events as ev
from trainer.runtime import Dist

DEFAULT_MAX_BAD_FRACTION = 0.1
DEFAULT_MAX_SKIPS_IN_A_ROW = 5
FIRST_ROWS_SHOWN = 5


class NonFiniteError(ValueError):
    """Training cannot go on: too much non-finite data, or a loss that stays non-finite."""


def row_stats_nonfinite(stats: Any) -> bool | None:
    """Whether a row record's ``stats`` count NaN/Inf values; None when it carries no stats."""
    if not isinstance(stats, dict) or not stats:
        return None
    return any(_nonfinite_count(s) for s in stats.values())


def _nonfinite_count(sums: Any) -> float:
    try:
        return float(sums[6])
    except (TypeError, ValueError, IndexError):
        return 0.0


def tensors_finite(data: dict[str, torch.Tensor]) -> bool:
    """True when the row's hidden states hold only finite values (reads them once)."""
    return all(bool(torch.isfinite(data[k]).all()) for k in ("hidden_state", "aux_hidden_state"))


def rows_text(rows: Iterable[int]) -> str:
    """``7, 23`` or ``7, 23, 40, 41, 52, ... (12 rows)``."""
    rows = sorted(rows)
    shown = ", ".join(str(r) for r in rows[:FIRST_ROWS_SHOWN])
    return shown if len(rows) <= FIRST_ROWS_SHOWN else f"{shown}, ... ({len(rows)} rows)"


def check_bad_fraction(data_dir: Path, bad: list[int], usable: int, max_fraction: float) -> None:
    """Raise NonFiniteError (one line) when more than ``max_fraction`` of the rows are bad."""
    total = usable + len(bad)
    if total and len(bad) / total > max_fraction:
        raise NonFiniteError(
            f"{data_dir}: {len(bad)} of {total} rows hold NaN/Inf hidden states (rows {rows_text(bad)}), "
            f"more than --max-bad-fraction {max_fraction:g}; re-extract them (check the target's "
            "weights and --dtype) or raise --max-bad-fraction to train on the rest")


@dataclass
class LossGuard:
    """Counts steps skipped for a non-finite loss or gradient; stops after N in a row."""

    max_in_a_row: int = DEFAULT_MAX_SKIPS_IN_A_ROW
    skipped: int = 0
    in_a_row: int = 0
    last_rows: list[int] = field(default_factory=list)

    def ok(self, step: int) -> None:
        """A good step ends a run of skips."""
        self.in_a_row = 0

    def skip(self, step: int, rows: list[int], what: str) -> None:
        """Count one skipped step; raise NonFiniteError after ``max_in_a_row`` in a row."""
        self.skipped += 1
        self.in_a_row += 1
        self.last_rows = rows
        if self.in_a_row >= self.max_in_a_row:
            raise NonFiniteError(
                f"training stopped at step {step}: the {what} was not finite in {self.in_a_row} steps "
                f"in a row (last batch: rows {rows_text(rows)}); check the data (hsmon verify-data, "
                "hsmon status) and the target's weights, or lower --lr")


def backward_unless_nonfinite(loss: torch.Tensor, params: list[torch.nn.Parameter], clip: float,
                              world: Dist) -> tuple[str, torch.Tensor]:
    """Backward and clip unless the loss is not finite on some rank. Returns ("loss", "gradient"
    or "" for a good step, the gradient norm); every rank agrees, so all skip the same steps."""
    bad = torch.tensor([0.0 if bool(torch.isfinite(loss.detach()).all()) else 1.0])
    if world.all_sum(bad)[0] > 0:
        return "loss", torch.tensor(float("nan"))
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(params, clip)
    bad = torch.tensor([0.0 if bool(torch.isfinite(grad_norm)) else 1.0])
    return ("gradient" if world.all_sum(bad)[0] > 0 else ""), grad_norm


def skip_step(guard: LossGuard, writer: ev.EventWriter | None, step: int, rows: list[int], what: str,
              counters: dict[str, Any]) -> None:
    """Count and report a skipped step; raises NonFiniteError after too many in a row."""
    if writer:
        writer.emit(ev.SKIP, step=step, reason=f"non-finite {what}", rows=rows[:20],
                    skipped_steps=guard.skipped + 1, in_a_row=guard.in_a_row + 1)
    counters.update(skipped_steps=guard.skipped + 1)
    guard.skip(step, rows, what)

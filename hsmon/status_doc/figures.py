"""A training's figures as every reader writes them: `hsmon status`, the dashboard's training tab
and the webhooks all print a loss, an accuracy or a learning rate through these functions, so the
same figure reads the same everywhere.

A loss or accuracy may be a list (one value per draft position the training unrolls): it is written
as the first position's value and the mean over the positions (``3.841 (pos 0), mean 3.903``); "step"
is the optimizer's step alone; a loss or a
gradient norm with at most 4 significant digits and 3 decimals, an accuracy or a share as a
percentage with 3 significant digits, a learning rate in one scientific notation (``3e-4``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from msgspec import UNSET

from hsmon.status_doc.numbers import fmt_count, fmt_num, fmt_pct_of, fmt_rate
from hsmon.status_doc.training import TrainingSection


def _number(value: Any) -> float | None:
    """``value`` as a finite float; None for what is not a number (UNSET, None, a bool, NaN)."""
    if value is UNSET or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def fmt_lr(value: Any) -> str:
    """A learning rate in one notation: 3e-4, 2.5e-3, 1e-2 ('-' unknown)."""
    lr = _number(value)
    if lr is None:
        return "-"
    if lr == 0:
        return "0"
    mantissa, exponent = f"{lr:.3e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


def fmt_unrolled(value: Any, fmt: Callable[[float], str]) -> str | None:
    """A per-position figure: '3.841 (pos 0), mean 3.903' for a list, ``fmt`` of a single
    number; None when nothing is known."""
    if isinstance(value, list):
        numbers = [v for v in map(_number, value) if v is not None]
        if not numbers:
            return None
        if len(numbers) == 1:
            return fmt(numbers[0])
        return f"{fmt(numbers[0])} (pos 0), mean {fmt(sum(numbers) / len(numbers))}"
    number = _number(value)
    return None if number is None else fmt(number)


def fmt_measure(value: float | None) -> str:
    """A loss or a norm: 4 significant digits from 1 up (3.841, 14.88, 1,235), 3 decimals below
    (0.095), scientific notation under a thousandth (1.2e-04); '-' unknown."""
    if value is None or value == 0 or abs(value) >= 1 or abs(value) < 1e-3:
        return fmt_num(value)
    return f"{value:.3f}"


def fmt_loss(value: Any) -> str | None:
    return fmt_unrolled(value, fmt_measure)


def fmt_acc(value: Any) -> str | None:
    return fmt_unrolled(value, fmt_pct_of)


def step_text(training: TrainingSection | None) -> str:
    """'step 120 / 1,000, epoch 0, 3.10k tok/s' ('-' for what is unknown)."""
    if training is None or _number(training.step) is None:
        return "step -"
    total = _number(training.total_steps)
    text = f"step {fmt_count(training.step)}" + (f" / {fmt_count(total)}" if total else "")
    if _number(training.epoch) is not None:
        text += f", epoch {fmt_count(training.epoch)}"
    if _number(training.tokens_per_s) is not None:
        text += f", {fmt_rate(training.tokens_per_s, ' tok/s')}"
    return text


def figure_texts(training: TrainingSection | None) -> list[str]:
    """The training's figures as 'name value' texts, in a fixed order, each only when the trainer
    sent it: loss, acc, lr, grad norm, data wait (the share of a step spent waiting for rows)."""
    if training is None:
        return []
    figures = (
        ("loss", fmt_loss(training.loss)),
        ("acc", fmt_acc(training.acc)),
        ("lr", fmt_lr(training.lr) if _number(training.lr) is not None else None),
        ("grad norm", fmt_measure(training.grad_norm) if _number(training.grad_norm) is not None else None),
        ("data wait", fmt_pct_of(training.data_wait_frac)
         if _number(training.data_wait_frac) is not None else None),
    )
    return [f"{name} {text}" for name, text in figures if text is not None]


def is_training(training: TrainingSection | None) -> bool:
    """Whether a job's training section is a training's (it has steps), not an evaluation's."""
    return training is not None and _number(training.step) is not None

"""Loss and accuracy at each draft position the training unrolls (its training-time test), each as a
bar plot over the training so far ("step" is the optimizer's step alone).

One row per position where room is short; where the screen has height to spare (the wide
layout gives the plot the rest of the column), each step's plots grow to several rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.text import Text
from textual.widget import Widget

from hsmon.status_doc.figures import fmt_measure
from hsmon.status_doc.numbers import fmt_count
from hsmon.tui.history import UnrollHistory
from hsmon.tui.series import axis_labels, fit
from hsmon.tui.view import fmt_pct_of

BARS = "▁▂▃▄▅▆▇█"
MAX_ROWS_PER_STEP = 6


def sparkline(values: Sequence[float], width: int, lo: float | None = None, hi: float | None = None) -> str:
    """The last ``width`` values as block characters scaled to [lo, hi] (their own range by default)."""
    return bars(values, width, 1, lo, hi)[0]


def bars(values: Sequence[float], width: int, height: int, lo: float | None = None,
         hi: float | None = None) -> list[str]:
    """The last ``width`` values as a bar plot ``height`` rows tall (top row first), scaled to
    [lo, hi]; the lowest value still shows a sliver, as in a sparkline."""
    values = list(values)[-width:]
    if not values:
        return [""] * height
    lo = min(values) if lo is None else lo
    hi = max(values) if hi is None else hi
    levels = height * len(BARS)
    span = hi - lo
    if span <= 0:
        tops = [levels // 2 + (1 if height == 1 else 0)] * len(values)
    else:
        tops = [1 + min(levels - 1, max(0, int((v - lo) / span * (levels - 1) + 0.5))) for v in values]
    rows = []
    for row in range(height):
        floor = (height - 1 - row) * len(BARS)
        rows.append("".join(" " if top <= floor else BARS[min(top - floor, len(BARS)) - 1] for top in tops))
    return rows


class UnrollPlot(Widget):
    """'pos i  loss ▇▆▅▄ 2.100  acc ▁▂▃▅ 41.0%' for every draft position, over the training's steps
    (its whole run, hsmon/tui/series.py), with the steps the plots span below them."""

    DEFAULT_CSS = "UnrollPlot { height: auto; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._history: UnrollHistory | None = None
        self._shown: tuple[Any, ...] = ()

    def set_history(self, history: UnrollHistory | None) -> None:
        key = () if history is None else (
            tuple(tuple(s.values()) for s in history.loss), tuple(tuple(s.values()) for s in history.acc),
            history.loss[0].span if history.loss else None)
        if key == self._shown:
            return
        grew = len(key[0] if key else ()) != len(self._shown[0] if self._shown else ())
        self._history, self._shown = history, key
        self.refresh(layout=grew)

    def _positions(self) -> int:
        history = self._history
        return 0 if history is None else max(len(history.loss), len(history.acc))

    def get_content_height(self, container: Any, viewport: Any, width: int) -> int:
        return max(1, self._positions() + 2) if self._positions() else 1

    def render(self) -> Text:
        history, positions = self._history, self._positions()
        if history is None or not positions:
            return Text("no training steps yet", style="dim")
        losses = [s.values() for s in history.loss]
        accs = [s.values() for s in history.acc]
        spark_width = max(4, (self.size.width - 22) // 2)
        per_step = max(1, min(MAX_ROWS_PER_STEP, (self.size.height - 2) // positions))
        all_loss = [v for s in losses for v in s]
        text = Text(f"{'':<7}{'loss':<{spark_width + 8}}acc", style="bold")
        for i in range(positions):
            loss = losses[i] if i < len(losses) else []
            acc = accs[i] if i < len(accs) else []
            loss_rows = bars(fit(loss, spark_width), spark_width, per_step, min(all_loss, default=0),
                             max(all_loss, default=1))
            acc_rows = bars(fit(acc, spark_width), spark_width, per_step, 0.0, 1.0)
            for row in range(per_step):
                last = row == per_step - 1
                text.append("\n" + (f"pos {i:<3}" if last else " " * 7))
                text.append(f"{loss_rows[row]:<{spark_width}}", style="red")
                text.append(f" {fmt_measure(loss[-1]) if loss and last else '':>6} ")
                text.append(f"{acc_rows[row]:<{spark_width}}", style="green")
                text.append(f" {fmt_pct_of(acc[-1]) if acc and last else '':>6}")
        span = history.loss[0].span if history.loss else None
        axis = axis_labels(span, spark_width, fmt_count)
        if axis:  # the optimizer steps the plots span, under each
            text.append(f"\n{'step':<7}{axis:<{spark_width}}{'':8}{axis}", style="grey50")
        return text

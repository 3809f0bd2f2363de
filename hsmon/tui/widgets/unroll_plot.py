"""Loss and accuracy per unroll step of the drafter, each as a sparkline over the training so far."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.text import Text
from textual.widget import Widget

from hsmon.tui.view import unroll_series

BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int, lo: float | None = None, hi: float | None = None) -> str:
    """The last ``width`` values as block characters scaled to [lo, hi] (their own range by default)."""
    values = list(values)[-width:]
    if not values:
        return ""
    lo = min(values) if lo is None else lo
    hi = max(values) if hi is None else hi
    span = hi - lo
    if span <= 0:
        return BARS[len(BARS) // 2] * len(values)
    return "".join(BARS[min(len(BARS) - 1, max(0, int((v - lo) / span * (len(BARS) - 1) + 0.5)))]
                   for v in values)


class UnrollPlot(Widget):
    """Rows 'step i  loss ▇▆▅▄ 2.10  acc ▁▂▃▅ 0.41' for every unroll step (TTT position)."""

    DEFAULT_CSS = "UnrollPlot { height: auto; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._history: list[dict[str, Any]] = []

    def set_history(self, history: Sequence[dict[str, Any]]) -> None:
        self._history = list(history)
        self.refresh(layout=True)

    def get_content_height(self, container: Any, viewport: Any, width: int) -> int:
        return max(1, len(unroll_series(self._history, "loss")) + 1)

    def render(self) -> Text:
        losses = unroll_series(self._history, "loss")
        accs = unroll_series(self._history, "acc")
        if not losses and not accs:
            return Text("no training steps yet", style="dim")
        width = self.size.width
        spark_width = max(4, (width - 34) // 2)
        all_loss = [v for s in losses for v in s]
        text = Text(f"{'':<6}{'loss':<{spark_width + 9}}acc", style="bold")
        for i in range(max(len(losses), len(accs))):
            loss = losses[i] if i < len(losses) else []
            acc = accs[i] if i < len(accs) else []
            text.append(f"\nstep{i:<2} ")
            text.append(f"{sparkline(loss, spark_width, min(all_loss), max(all_loss)):<{spark_width}}",
                        style="red")
            text.append(f" {loss[-1]:6.3f}  " if loss else f" {'-':>6}  ")
            text.append(f"{sparkline(acc, spark_width, 0.0, 1.0):<{spark_width}}", style="green")
            text.append(f" {acc[-1]:5.1%}" if acc else f" {'-':>5}")
        return text

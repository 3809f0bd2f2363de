"""A labelled progress bar drawn as text: cheap (no animation), exact, and fits any width."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from hsmon.tui.view import fraction, progress_label


class Meter(Widget):
    """``label ━━━━━━╸────  done / total (pct)``; an unknown total shows an empty bar and '?'."""

    DEFAULT_CSS = "Meter { height: 1; }"

    done: reactive[float | None] = reactive(None)
    total: reactive[float | None] = reactive(None)

    def __init__(self, label: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.label = label

    def set_value(self, done: float | None, total: float | None) -> None:
        self.done, self.total = done, total

    def render(self) -> Text:
        caption = progress_label(self.done, self.total)
        width = self.size.width
        bar_width = max(4, width - max(7, len(self.label)) - len(caption) - 1)
        frac = fraction(self.done, self.total)
        filled = round((frac or 0.0) * bar_width)
        text = Text(f"{self.label:<7}", style="bold")
        text.append("━" * filled, style="green" if frac and frac >= 1 else "bright_blue")
        text.append("─" * (bar_width - filled), style="grey37")
        text.append(f" {caption}")
        return text

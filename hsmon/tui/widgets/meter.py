"""A labelled progress bar drawn as text: cheap (no animation), exact, and fits any width."""

from __future__ import annotations

from rich.text import Text
from textual.strip import Strip
from textual.widget import Widget

from hsmon.tui.view import fraction, progress_label
from hsmon.tui.widgets.quiet import text_strip


def meter_text(label: str, done: float | None, total: float | None, width: int) -> Text:
    """``label ━━━━━━╸────  done / total (pct)`` in ``width`` cells; an unknown total shows an
    empty bar and '?'."""
    caption = progress_label(done, total)
    bar_width = max(4, width - max(7, len(label)) - len(caption) - 1)
    frac = fraction(done, total)
    filled = round((frac or 0.0) * bar_width)
    text = Text(f"{label:<7}", style="bold")
    text.append("━" * filled, style="green" if frac and frac >= 1 else "bright_blue")
    text.append("─" * (bar_width - filled), style="grey37")
    text.append(f" {caption}")
    return text


class Meter(Widget):
    """One line; repainted only when what it shows changes (not at every new count behind the same
    rounded figures), and drawn straight into a strip (by Textual when it must wrap)."""

    DEFAULT_CSS = "Meter { height: 1; }"

    def __init__(self, label: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.label = label
        self.done: float | None = None
        self.total: float | None = None
        self._key: tuple[object, ...] | None = None
        self._strip: Strip | None = None

    def _text(self) -> Text:
        return meter_text(self.label, self.done, self.total, self.size.width)

    def set_value(self, done: float | None, total: float | None) -> None:
        if (done, total) == (self.done, self.total):
            return
        shown = self._text()
        self.done, self.total = done, total
        text = self._text()
        if (text.plain, text.spans) != (shown.plain, shown.spans):
            self.refresh()

    def render(self) -> Text:
        return self._text()

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self.visual_style.rich_style
        if y:
            return Strip.blank(width, base)
        text = self._text()
        if text.cell_len > width:  # too narrow for the caption: let Textual wrap it, as before
            return super().render_line(y)
        key = (text.plain, tuple(text.spans), width, base)
        if key != self._key or self._strip is None:
            self._key, self._strip = key, text_strip(text, width, base)
        return self._strip

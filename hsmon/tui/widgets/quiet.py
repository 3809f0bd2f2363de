"""Text that redraws only when it changed, and re-lays out only when its size may have changed.

A full layout pass per widget per refresh is most of the dashboard's CPU at one update a second,
and most figures keep their shape: the same text, or text of the same lines and length.
"""

from __future__ import annotations

from typing import ClassVar

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import active_app
from textual.scrollbar import ScrollBarRender
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Static


def _plain(text: Text | str) -> str:
    return text.plain if isinstance(text, Text) else text


def _shape(text: Text | str) -> tuple[int, int | None]:
    """(newlines, length or None when it cannot wrap): equal shapes take the same room."""
    plain = _plain(text)
    no_wrap = isinstance(text, Text) and bool(text.no_wrap)
    return plain.count("\n"), None if no_wrap else len(plain)


class QuietStatic(Static):
    """A Static whose ``show_text`` skips unchanged text and needless layout passes."""

    # Figures that change every second (a job's header, its rates) draw their lines straight into
    # strips; only where no CSS colours the text (an alpha colour blends otherwise).
    DRAW_DIRECT: ClassVar[bool] = False
    _shown: Text | str | None = None
    _lines_key: tuple[object, ...] | None = None
    _lines: list[Strip] | None = None

    def show_text(self, text: Text | str) -> None:
        if text == self._shown:
            return
        before = self._shown
        self._shown = text
        self.update(text, layout=before is None or self._may_resize(before, text))

    def render_line(self, y: int) -> Strip:
        """A line of a text that fits (no line wider than the content, left-aligned) drawn straight
        into a strip (the figures that change every second); anything else as a Static draws it."""
        text = self._shown
        if not self.DRAW_DIRECT:
            return super().render_line(y)
        if isinstance(text, str) and "[" not in text:
            text = Text(text)
        width = self.size.width
        if (not isinstance(text, Text) or "\t" in text.plain or text.justify not in (None, "default", "left")
                or self.styles.content_align != ("left", "top") or self.styles.text_align != "start"):
            return super().render_line(y)
        base = self.visual_style.rich_style
        key = (text.plain, tuple(text.spans), text.style, width, base)
        if key != self._lines_key:
            lines = text.split("\n", allow_blank=True)
            self._lines = None if any(line.cell_len > width for line in lines) else [
                text_strip(line, width, base) for line in lines]
            self._lines_key = key
        if self._lines is None:
            return super().render_line(y)
        return self._lines[y] if y < len(self._lines) else Strip.blank(width, base)

    def _may_resize(self, before: Text | str, after: Text | str) -> bool:
        """Whether ``after`` may take other room than ``before``: another number of lines, or a
        line that may wrap (longer than the width) and another length; a width that follows the
        content (width: auto) always may."""
        if _shape(before) == _shape(after):
            return False
        if _shape(before)[0] != _shape(after)[0]:
            return True
        width, rule = self.content_size.width, self.styles.width
        if not width or (rule is not None and rule.is_auto):
            return True
        lines = [*_plain(before).split("\n"), *_plain(after).split("\n")]
        return any(cell_len(line) > width for line in lines)


def text_strip(text: Text, width: int, base: Style) -> Strip:
    """A one-line Text as a Static draws it on ``base`` (the widget's style), cut to ``width``: for
    a line that changes every second, without the console, wrapping and visual layers."""
    segments = [Segment(part, base + style if style else base)
                for part, style, _ in text.render(active_app.get().console) if part]
    strip = Strip(segments)
    return strip.crop(0, width) if strip.cell_length > width else strip


def set_border_title(widget: Widget, title: str) -> None:
    """Set a border title only when it changed: every assignment repaints the whole widget."""
    if getattr(widget, "_shown_border_title", None) != title:
        widget._shown_border_title = title  # type: ignore[attr-defined]
        widget.border_title = title


def set_border_subtitle(widget: Widget, subtitle: str) -> None:
    """Set a border subtitle only when it changed (see ``set_border_title``)."""
    if getattr(widget, "_shown_border_subtitle", None) != subtitle:
        widget._shown_border_subtitle = subtitle  # type: ignore[attr-defined]
        widget.border_subtitle = subtitle


def set_display(widget: Widget, shown: bool) -> None:
    """Show or hide a widget, touching it only when that changes."""
    if widget.display != shown:
        widget.display = shown


class WholeCellScrollBar(ScrollBarRender):
    """A scrollbar thumb of whole cells: no half-block glyph (a stray '▄▄' at the right edge of a
    terminal copy) at its ends."""

    VERTICAL_BARS: ClassVar[list[str]] = [" "] * len(ScrollBarRender.VERTICAL_BARS)

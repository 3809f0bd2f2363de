"""Textual's Sparkline, drawn straight into a strip.

Textual renders a sparkline through rich's console and its visual layer (bucketing with
fractions, a style per bar, then cropping and splitting lines): about a millisecond per line,
and three sparklines move every second while a job streams. This draws the same bars in the same
colours (tests/test_tui_spark.py compares it with Textual's own rendering) at a fraction of that.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import lru_cache

from rich.color import Color
from rich.segment import Segment
from rich.style import Style
from textual.renderables.sparkline import Sparkline as SparklineRenderable
from textual.strip import Strip
from textual.widgets import Sparkline

BARS = SparklineRenderable.BARS


def spark_bars(data: Sequence[float], width: int, min_color: Color, max_color: Color,
               summary: Callable[[Sequence[float]], float] = max) -> list[tuple[str, Style]]:
    """(bar, style) per cell of a one-line sparkline, as textual.renderables.sparkline draws it:
    ``data`` in ``width`` buckets, each bar's height and colour (blended from ``min_color`` to
    ``max_color``) from its bucket's ``summary`` scaled between the data's min and max."""
    count = len(data)
    if count == 0:
        return [("▁" * width, Style.from_color(min_color))]
    if count == 1:
        return [("█" * width, Style.from_color(max_color))]
    low, high = min(data), max(data)
    extent = high - low or 1
    # Fraction(count, width) * i truncated, in integers: the same partition.
    buckets = [part for i in range(width) if (part := data[count * i // width:count * (i + 1) // width])]
    step = len(buckets) / width
    index = 0.0
    bars = []
    if min_color.triplet is None or max_color.triplet is None:
        blend = None  # blend_colors gives max_color then
    else:
        (r1, g1, b1), (r2, g2, b2) = min_color.triplet, max_color.triplet
        blend = (r1, r2 - r1, g1, g2 - g1, b1, b2 - b1)
    for _ in range(width):
        ratio = (summary(buckets[int(index)]) - low) / extent
        if blend is None:
            style = _color_style(max_color)
        else:  # blend_colors' arithmetic; Color.from_rgb truncates to whole numbers: one style each
            r, dr, g, dg, b, db = blend
            style = _rgb_style(int(r + dr * ratio), int(g + dg * ratio), int(b + db * ratio))
        bars.append((BARS[int(ratio * (len(BARS) - 1)) % len(BARS)], style))
        index += step
    return bars


@lru_cache(maxsize=1024)
def _rgb_style(red: int, green: int, blue: int) -> Style:
    return Style.from_color(Color.from_rgb(red, green, blue))


@lru_cache(maxsize=64)
def _color_style(color: Color) -> Style:
    return Style.from_color(color)


class QuietSparkline(Sparkline):
    """A one-line Sparkline whose line is built directly (and kept while data, size and colours
    stay); taller ones, or data that is not all finite numbers, are left to Textual."""

    _line_key: tuple[object, ...] | None = None
    _line: Strip | None = None

    def render_line(self, y: int) -> Strip:
        data = list(self.data or [])
        if self.size.height != 1 or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in data):
            return super().render_line(y)
        renderable = self.render()
        base = self.visual_style.rich_style
        min_color, max_color = renderable.min_color.color, renderable.max_color.color
        width = renderable.width or self.size.width
        key = (tuple(data), width, base, min_color, max_color, self.summary_function)
        if key != self._line_key or self._line is None:
            if min_color is None or max_color is None:
                return super().render_line(y)
            segments: list[Segment] = []
            for bar, style in spark_bars(data, width, min_color, max_color, self.summary_function):
                if segments and segments[-1].style is style:  # a run of equal bars: one segment
                    segments[-1] = Segment(segments[-1].text + bar, style)
                else:
                    segments.append(Segment(bar, style))
            self._line = Strip([Segment(text, base + style) for text, style, _ in segments], width)
            self._line_key = key
        return self._line

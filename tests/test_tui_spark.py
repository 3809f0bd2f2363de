"""The sparkline drawn straight into a strip looks exactly like Textual's own."""

from __future__ import annotations

import random

import pytest
from textual.app import App, ComposeResult
from textual.widgets import Sparkline

from hsmon.tui.widgets.spark import QuietSparkline

pytestmark = pytest.mark.asyncio
SERIES = [[], [5.0], [0.0, 0.0, 0.0], [1.0, 2.0], list(range(60)), [0.0] * 30 + [1000.0] * 30,
          [random.Random(seed).uniform(0, 2000) for seed in range(60)],
          [random.Random(seed).uniform(0, 5) for seed in range(7)],
          [3, 1, 4, 1, 5, 9, 2, 6]]


class Pair(App[None]):
    CSS = "Sparkline { width: 1fr; }"

    def compose(self) -> ComposeResult:
        yield Sparkline([], id="textual")
        yield QuietSparkline([], id="quiet")


def cells(app: App[None], widget: Sparkline) -> list[tuple[str, str]]:
    """(character, style) of every cell of the widget's line as composited on screen."""
    y = widget.region.y
    strip = app.screen._compositor.render_strips()[y]
    out = []
    for segment in strip.crop(widget.region.x, widget.region.right):
        out.extend((char, str(segment.style)) for char in segment.text)
    return out


@pytest.mark.parametrize("width", [23, 60, 137])
async def test_same_cells_as_textuals_sparkline(width: int) -> None:
    app = Pair()
    async with app.run_test(size=(width, 4)) as pilot:
        textual, quiet = app.query_one("#textual", Sparkline), app.query_one("#quiet", QuietSparkline)
        for series in SERIES:
            textual.data, quiet.data = list(series), list(series)
            await pilot.pause()
            want, got = cells(app, textual), cells(app, quiet)
            assert len(want) == width
            assert got == want, series

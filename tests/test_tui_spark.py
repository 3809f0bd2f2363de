"""Widgets drawn straight into a strip (sparklines, progress meters, a job's header) look exactly
like Textual's own rendering of the same thing."""

from __future__ import annotations

import random

import pytest
from rich.style import Style
from textual.app import App, ComposeResult
from textual.containers import Vertical
from textual.widget import Widget
from textual.widgets import Sparkline, Static
from tui_complete import typed_job

from hsmon.tui.widgets.job_header import JobHeader
from hsmon.tui.widgets.meter import Meter, meter_text
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


def cells(app: App[None], widget: Widget, line: int = 0) -> list[tuple[str, str]]:
    """(character, style) of every cell of the widget's line as composited on screen; of a blank,
    its background only (Textual drops the foreground and boldness of blanks, which show nothing)."""
    strip = app.screen._compositor.render_strips()[widget.region.y + line]
    out = []
    for segment in strip.crop(widget.region.x, widget.region.right):
        style = segment.style or Style()
        for char in segment.text:
            out.append((char, str(Style(bgcolor=style.bgcolor) if char == " " else style)))
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


class MeterPair(App[None]):
    CSS = ".panel { border: round $primary 50%; padding: 0 1; height: auto; }"

    def compose(self) -> ComposeResult:
        with Vertical(classes="panel"):
            yield Static("", id="textual")
        with Vertical(classes="panel"):
            yield Meter("rows", id="quiet")


METER_VALUES = [(None, None), (0, 100), (1, 3), (37, 100), (100, 100), (150, 100), (12_345_678, None),
                (5, 0), (2_000_000, 1_000_000_000_000)]


@pytest.mark.parametrize("width", [30, 78, 150])
async def test_meter_same_cells_as_a_static_of_its_text(width: int) -> None:
    app = MeterPair()
    async with app.run_test(size=(width, 8)) as pilot:
        static, meter = app.query_one("#textual", Static), app.query_one(Meter)
        for done, total in METER_VALUES:
            meter.set_value(done, total)
            static.update(meter_text("rows", done, total, meter.size.width))
            await pilot.pause()
            want = cells(app, static)
            got = cells(app, meter)
            assert "".join(c for c, _ in got).strip(), (done, total)
            assert got == want, (done, total)


async def test_meter_repaints_only_when_its_text_changes() -> None:
    app = MeterPair()
    async with app.run_test(size=(80, 8)) as pilot:
        meter = app.query_one(Meter)
        meter.set_value(19_100, 1_000_000_000)
        await pilot.pause()
        meter.set_value(19_120, 1_000_000_000)  # still "19.1k / 1.00G (0.0%)"
        assert not meter._repaint_required
        meter.set_value(20_100, 1_000_000_000)
        assert meter._repaint_required


class HeaderPair(App[None]):
    def compose(self) -> ComposeResult:
        yield Static("", id="textual")
        yield JobHeader(id="quiet")


async def test_a_job_header_drawn_into_strips_has_the_cells_of_a_static() -> None:
    job = {"job": "extract", "kind": "extract", "state": "stalled", "reason": "no progress for 4m",
           "progress": {"elapsed_s": 65.0, "eta_s": 300.0}}
    app = HeaderPair()
    async with app.run_test(size=(70, 8)) as pilot:
        static, header = app.query_one("#textual", Static), app.query_one(JobHeader)
        header.show(typed_job(job), stale="fixture disconnected: figures are 5s old")
        await pilot.pause()
        static.update(header._shown)
        await pilot.pause()
        assert header._lines is not None and len(header._lines) == 3  # drawn directly
        for line in range(3):
            got = cells(app, header, line)
            assert got == cells(app, static, line), line
            assert "".join(c for c, _ in got).strip()

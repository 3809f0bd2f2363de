"""What a new document repaints: no layout pass where only content changes (a layout pass repaints
the whole screen), and the screen still shows the new content."""

from __future__ import annotations

import pytest
from rich.text import Text
from textual.app import App, ComposeResult

from hsmon.tui.widgets.event_log import EventLines, EventLog
from hsmon.tui.widgets.quiet import QuietStatic

pytestmark = pytest.mark.asyncio


def events(count: int) -> list[dict]:
    return [{"v": 1, "ts": 1000.0 + i, "job": "extract", "kind": "row", "row": i} for i in range(count)]


class LogApp(App[None]):
    CSS = "EventLog { height: 10; }"

    def compose(self) -> ComposeResult:
        yield EventLog()


def screen_text(app: App[None]) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


async def test_the_event_log_fills_without_a_layout_pass_and_shows_the_newest() -> None:
    app = LogApp()
    async with app.run_test(size=(60, 12)) as pilot:
        log, lines = app.query_one(EventLog), app.query_one(EventLines)
        log.show({}, 1100.0, events(20))
        await pilot.pause()
        assert lines.show_vertical_scrollbar and "row 19" in screen_text(app)
        log.show({}, 1100.0, events(40))
        assert not lines._layout_required  # the scrollbar stays; only its thumb changes
        assert lines.vertical_scrollbar.window_virtual_size == 40
        await pilot.pause()
        await pilot.pause()
        assert "row 39" in screen_text(app) and lines.scroll_y == lines.max_scroll_y
        log.show({}, 1100.0, events(2))  # the scrollbar goes: a layout pass
        assert lines._layout_required


class LabelApp(App[None]):
    CSS = "QuietStatic { width: 30; height: auto; }"

    def compose(self) -> ComposeResult:
        yield QuietStatic()


async def test_a_static_is_laid_out_again_only_when_its_text_may_take_other_room() -> None:
    app = LabelApp()
    async with app.run_test(size=(60, 6)) as pilot:
        label = app.query_one(QuietStatic)
        label.show_text(Text("elapsed 59s  ETA 4m"))
        await pilot.pause()
        label.show_text(Text("elapsed 1m  ETA 4m"))  # shorter, one line either way
        assert not label._layout_required and label._repaint_required
        await pilot.pause()
        assert "elapsed 1m  ETA 4m" in screen_text(app)
        label.show_text(Text("elapsed 1m  ETA 4m and a reason long enough to wrap"))
        assert label._layout_required
        await pilot.pause()
        assert label.size.height == 2
        label.show_text(Text("elapsed 1m  ETA 4m\nreason"))  # another number of lines
        assert label._layout_required

"""The dashboard as a daily tool, in a pilot on fixed documents (tests/tui_documents.py): every panel
reachable without knowing to Tab, the help saying how; the launch form's hints whole at 80, 120 and
160 columns; the event log's clock times, search and scrolling; a job's whole history kept at a
bounded size (hsmon/tui/series.py). The same on real processes: tests/test_tui_logs.py."""

from __future__ import annotations

import time

import pytest
from test_tui_pilot import screen_text, wait_for
from test_tui_snapshots import DATA_DIR, all_documents_shown, data_dir, make_app  # noqa: F401 (fixture)
from textual.widgets import Input

from hsmon.tui.screens.help import help_text
from hsmon.tui.series import CAPACITY, Series, fit
from hsmon.tui.widgets.event_log import EventLines, EventLog
from hsmon.tui.widgets.job_overview import JobOverview
from hsmon.tui.widgets.processes import ProcessTable
from hsmon.tui.widgets.training_form import FOLLOW_FIELDS

SIZES = [(80, 24), (120, 40), (160, 48)]


@pytest.mark.asyncio
async def test_every_panel_is_reached_with_page_down_and_the_help_says_so() -> None:
    """At 80x24 the panels below the first screen (processes, events) come into view with pgdn,
    nothing focused first (they needed Tab); the help and the footer name the key."""
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await all_documents_shown(pilot)
        overview = app.screen.query_one(JobOverview)
        events = app.screen.query_one(EventLog)
        assert app.focused is not overview and overview.scroll_y == 0  # the tabs hold the focus
        assert not overview.region.contains_region(events.region)  # below the screen
        assert "pgdn more" in screen_text(app)  # the footer
        for _ in range(10):
            await pilot.press("pagedown")
        await pilot.pause(0.1)
        assert overview.scroll_y == overview.max_scroll_y > 0
        assert "events" in screen_text(app) and "processes" in screen_text(app)
        assert app.screen.query_one(ProcessTable).region.y >= 0
        await pilot.press("home")
        await pilot.pause(0.1)
        assert overview.scroll_y == 0
    assert "pgdn pgup  the panels below the screen" in help_text().plain


@pytest.mark.asyncio
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
async def test_the_launch_forms_hints_are_whole(size: tuple[int, int]) -> None:
    """Every empty field of the launch form shows its whole hint: none cut at 80, 120 or 160
    columns (the draft vocabulary's and the time limit's were)."""
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await all_documents_shown(pilot)
        await pilot.press("t")
        await pilot.pause(0.3)
        fields = [f for f in app.screen.query(Input) if f.id and f.id.startswith("field-")
                  and f.id.removeprefix("field-") not in FOLLOW_FIELDS]  # those: an online extraction's
        assert len(fields) == 12
        for field in fields:
            room = field.content_region.width
            assert len(str(field.placeholder)) <= room, (size, field.id, field.placeholder, room)


@pytest.mark.asyncio
async def test_the_event_log_has_clock_times_searches_and_scrolls() -> None:
    app = make_app()
    async with app.run_test(size=(160, 48)) as pilot:
        await all_documents_shown(pilot)
        log = app.screen.query_one(EventLog)
        lines = app.screen.query_one(EventLines)
        event = log.current_event()
        assert event is not None
        stamp = time.strftime("%H:%M:%S", time.localtime(event["ts"]))
        assert f"{stamp} " in screen_text(app)  # a clock time, not only "-21s"
        total = lines.line_count
        await pilot.press("slash")
        await pilot.pause(0.1)
        assert isinstance(app.focused, Input) and app.focused.id == "event-search"
        for key in "reject":
            await pilot.press(key)
        await wait_for(pilot, lambda: lines.line_count < total)
        assert log.search == "reject"  # the "/" that opened the field is not part of it
        shown = [lines.line_text(i) for i in range(lines.line_count)]
        assert shown and all("reject" in line.lower() for line in shown), shown
        assert "/reject" in screen_text(app) and f"({lines.line_count} found" in screen_text(app)
        await pilot.press("enter")  # keeps the search, the lines take the focus: arrows scroll them
        await pilot.pause(0.1)
        assert app.focused is lines
        await pilot.press("up", "up")
        assert lines.highlighted == lines.line_count - 2
        await pilot.press("slash", "escape")  # clears it
        await wait_for(pilot, lambda: lines.line_count == total)
        assert log.search == ""


def test_a_series_keeps_the_whole_run_at_a_bounded_size() -> None:
    """A million readings a second apart (11 days) in at most CAPACITY buckets, spanning the first
    to the last; each bucket the mean of its readings; adding costs the same at the end as at the
    start (no pass over what is kept, but a merge once per doubling)."""
    series = Series()
    for i in range(1_000_000):
        series.add(1000.0 + i, float(i % 100))
        assert len(series) <= CAPACITY
    assert series.span == (1000.0, 1000.0 + 999_999)
    assert series.added == 1_000_000 and series.width * CAPACITY >= 999_999
    values = series.values()
    assert all(v == pytest.approx(49.5, abs=1.0) for v in values[:-1])  # each bucket averages 0..99
    older = Series()
    older.add(10.0, 1.0)
    older.add(20.0, 2.0)
    older.rebuilt([(0.0, 5.0)])  # readings from before (the events file's backfill)
    assert older.span == (0.0, 20.0) and older.values()[0] == 5.0 and older.values()[-1] == 2.0
    assert fit([1, 2, 3, 4, 5, 6], 3) == [2, 4, 6]  # each cell the reading at its end: the newest last

"""Every control of `hsmon tui`, driven with Textual's pilot (App.run_test)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Button, Input, Static, TabbedContent, TabPane
from textual.widgets._tabbed_content import ContentTab
from tui_complete import fixed_source, typed_job
from tui_documents import documents
from tui_status_server import StatusServer

from hsmon.contracts.layout import MANIFEST_NAME
from hsmon.tui.app import HsmonApp
from hsmon.tui.screens.confirm import ConfirmScreen
from hsmon.tui.screens.event_detail import EventDetailScreen
from hsmon.tui.screens.help import HelpScreen
from hsmon.tui.screens.overview import OverviewScreen
from hsmon.tui.screens.training import TrainingScreen
from hsmon.tui.sources import HttpStatusSource
from hsmon.tui.widgets.connection_bar import ConnectionBar
from hsmon.tui.widgets.event_log import EventLines, EventLog
from hsmon.tui.widgets.job_header import JobHeader

pytestmark = pytest.mark.asyncio


async def wait_for(pilot: Pilot, condition: Callable[[], Any], timeout: float = 10.0) -> None:
    """Let the app run until ``condition()`` holds (sources deliver from their own threads)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {condition}")
        await pilot.pause(0.05)


async def laid_out(pilot: Pilot) -> None:
    """Let a screen just shown settle: its figures arrive and the layout moves the widgets once
    more, so a click lands where the widget ends up."""
    await pilot.pause(0.3)
    await pilot.wait_for_scheduled_animations()


def screen_text(app: HsmonApp) -> str:
    """What the terminal shows, as plain text."""
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


@asynccontextmanager
async def running(
    sources: list[Any], size: tuple[int, int] = (100, 40)
) -> AsyncIterator[tuple[HsmonApp, Pilot]]:
    app = HsmonApp(sources)
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.documents and app.query(TabbedContent).first().display)
        yield app, pilot


def fixed(count: int = 3) -> list[Any]:
    return [fixed_source(documents(count), label="fixture")]


async def test_overview_shows_the_job_with_tabs_per_job() -> None:
    async with running(fixed()) as (app, pilot):
        await wait_for(pilot, lambda: "SILENT" in screen_text(app))
        text = screen_text(app)
        assert "extract (extract)" in text and "ETA 4h29m" in text
        assert "PYTHONUNBUFFERED" in text  # the buffering hint, prominent
        tabs = app.screen.query_one(TabbedContent)
        assert [str(tab.label) for tab in tabs.query("Tab")] == ["extract", "train"]


async def test_next_previous_and_clicked_tabs() -> None:
    async with running(fixed()) as (app, pilot):
        tabs = app.screen.query_one(TabbedContent)
        assert tabs.active == "job-0-extract"
        await pilot.press("n")
        await wait_for(pilot, lambda: app.selected == (0, "train"))
        assert "RUNNING" in screen_text(app)
        await pilot.press("p")
        await wait_for(pilot, lambda: tabs.active == "job-0-extract")
        await pilot.click("#--content-tab-job-0-train")
        await wait_for(pilot, lambda: tabs.active == "job-0-train")


def log_text(log: EventLog) -> str:
    """The event log's lines, as shown."""
    lines = log.query_one("#event-lines", EventLines)
    return "\n".join(lines.line_text(i) for i in range(lines.line_count))


async def test_event_filter_by_key_and_by_mouse() -> None:
    docs = documents(3)
    docs[-1]["jobs"][0]["recent_events"].append(
        {"v": 1, "ts": docs[-1]["generated_ts"] - 1, "job": "extract", "kind": "heartbeat", "rows_done": 2520}
    )
    async with running([fixed_source(docs, label="fixture")]) as (app, pilot):
        log = app.screen.query_one(EventLog)
        await wait_for(pilot, lambda: "retry" in log_text(log) and "chunk" in log_text(log))
        assert "heartbeat" not in log_text(log)  # hidden by default
        await pilot.press("f")
        await wait_for(pilot, lambda: log.which == "errors")
        shown = log_text(log)
        assert "retry" in shown and "reject" not in shown and "chunk" not in shown
        await pilot.press("f")
        await wait_for(pilot, lambda: log.which == "rejects")
        shown = log_text(log)
        assert "reject row 2101: empty text" in shown and "retry" not in shown
        await pilot.press("f")
        await wait_for(pilot, lambda: log.which == "+heartbeats")
        assert "heartbeat: 2,520 rows" in log_text(log) and "chunk" in log_text(log)
        bar = log.query_one("#event-filter")
        bar.scroll_visible(animate=False)
        await pilot.pause(0.1)
        await pilot.click(bar, offset=(14, 0))  # 'show:  all   errors   rejects': on 'errors'
        await wait_for(pilot, lambda: log.which == "errors")
        await pilot.click(bar, offset=(8, 0))  # on 'all'
        await wait_for(pilot, lambda: log.which == "all")
        assert "chunk" in log_text(log)


async def test_enter_or_e_shows_the_whole_event() -> None:
    async with running(fixed()) as (app, pilot):
        await pilot.press("e")  # nothing highlighted: the newest line
        await wait_for(pilot, lambda: isinstance(app.screen, EventDetailScreen))
        text = screen_text(app)
        assert "reject event of extract" in text and '"reason": "too long"' in text and '"row": 2417' in text
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen))
        lines = app.screen.query_one("#event-lines", EventLines)
        lines.focus()
        await pilot.pause(0.1)
        await pilot.press("home", "down")  # the second line: the chunk
        await wait_for(pilot, lambda: lines.highlighted == 1)
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, EventDetailScreen))
        assert '"chunk": "rows_0-2000"' in screen_text(app)
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen))


async def test_help_opens_and_closes() -> None:
    async with running(fixed()) as (app, pilot):
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        assert "event filter" in screen_text(app)
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen))


async def test_training_screen_prefilled_and_warns_unfinished_extraction() -> None:
    async with running(fixed()) as (app, pilot):
        await pilot.press("t")
        await wait_for(pilot, lambda: isinstance(app.screen, TrainingScreen))
        screen = app.screen
        assert screen.query_one("#field-data_dir", Input).value == "/data/out"
        assert screen.query_one("#field-out_dir", Input).value == "/data/out-drafter"
        assert screen.query_one("#field-target_model", Input).value == "/models/target"
        assert "unfinished" in str(screen.query_one("#form-warning", Static).render())
        text = screen_text(app)
        assert "pos 0" in text and "pos 6" in text  # loss/acc per draft position
        assert "tok/s" in text and "ckpt-40" in text
        await pilot.press("o")
        await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen))


async def test_resize_switches_between_narrow_and_wide_layouts() -> None:
    async with running(fixed(), size=(80, 24)) as (app, pilot):
        assert app.screen.has_class("-narrow")
        await pilot.resize_terminal(160, 48)
        await wait_for(pilot, lambda: app.screen.has_class("-wide"))
        await pilot.resize_terminal(80, 24)
        await wait_for(pilot, lambda: app.screen.has_class("-narrow"))
        assert "SILENT" in screen_text(app)


async def test_refresh_key_reads_the_daemon_again() -> None:
    server = StatusServer(documents(3))
    try:
        async with running([HttpStatusSource(server.url, interval=30.0)]) as (_app, pilot):
            before = server.gets
            await pilot.press("r")
            await wait_for(pilot, lambda: server.gets > before)
    finally:
        server.close()


async def test_disconnected_then_recovers_without_restart() -> None:
    server = StatusServer(documents(3))
    port = server.port
    try:
        async with running([HttpStatusSource(server.url, interval=0.2, timeout=1.0)]) as (app, pilot):
            bar = app.screen.query_one(ConnectionBar)
            server.close()
            await wait_for(pilot, lambda: "disconnected, retrying" in str(bar.render()))
            assert "disconnected, retrying" in screen_text(app)
            assert "figures are" in str(app.screen.query_one(JobHeader).render())
            server = StatusServer(documents(3), port=port)
            await wait_for(pilot, lambda: "disconnected" not in str(bar.render()), timeout=15)
            assert not bar.has_class("-down")
    finally:
        server.close()


def extraction_dir(tmp_path: Path) -> str:
    """A real (tiny) extraction output: what validate_training_request accepts as data_dir."""
    out = tmp_path / "out"
    out.mkdir()
    (out / MANIFEST_NAME).write_text('{"type": "run"}\n')
    return str(out)


async def test_launch_through_the_daemon_sends_the_form_with_the_token(tmp_path: Path) -> None:
    out = extraction_dir(tmp_path)
    server = StatusServer(documents(3, out=out, model="embedded"))
    try:
        source = HttpStatusSource(server.url, token="s3cret", interval=0.5)
        async with running([source]) as (app, pilot):
            await pilot.press("t")
            await wait_for(pilot, lambda: isinstance(app.screen, TrainingScreen))
            await pilot.press("l")
            await wait_for(pilot, lambda: any(path == "/api/v1/train" for path, _, _ in server.requests))
            _path, body, auth = server.requests[-1]
            assert auth == "Bearer s3cret"
            assert body["data_dir"] == out and body["out_dir"] == f"{out}-drafter"
            assert body["ttt_length"] == "7" and body["target_model"] == ""
            await wait_for(pilot, lambda: app.launched == (0, "train-1"))
    finally:
        server.close()


async def test_launch_without_token_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    server = StatusServer(documents(3, out=extraction_dir(tmp_path), model="embedded"))
    try:
        async with running([HttpStatusSource(server.url, token=None, interval=0.5)]) as (app, pilot):
            await pilot.press("t")
            await wait_for(pilot, lambda: isinstance(app.screen, TrainingScreen))
            await laid_out(pilot)
            await pilot.click("#launch")
            await wait_for(pilot, lambda: any("token" in n.message for n in app._notifications))
            # only the empty probe of both sides of the token (hsmon/tui/control_check.py): no launch
            assert server.requests == [("/api/v1/train", {}, None)]
    finally:
        server.close()


async def test_field_errors_from_the_daemon_show_inline(tmp_path: Path) -> None:
    server = StatusServer(documents(3, out=extraction_dir(tmp_path), model="embedded"))
    server.launch_reply = (400, {"message": "invalid request", "errors": {"epochs": "epochs: must be >= 1"}})
    try:
        async with running([HttpStatusSource(server.url, token="s3cret", interval=0.5)]) as (app, pilot):
            await pilot.press("t")
            await wait_for(pilot, lambda: isinstance(app.screen, TrainingScreen))
            await pilot.press("l")
            error = app.screen.query_one("#error-epochs", Static)
            await wait_for(pilot, lambda: error.display and "must be >= 1" in str(error.render()))
            assert app.screen.query_one("#field-epochs", Input).has_class("-invalid")
    finally:
        server.close()


async def test_stop_asks_first_and_no_keeps_it_running() -> None:
    server = StatusServer(documents(3))
    try:
        async with running([HttpStatusSource(server.url, token="s3cret", interval=0.5)]) as (app, pilot):
            await pilot.press("t")
            await wait_for(pilot, lambda: isinstance(app.screen, TrainingScreen))
            await pilot.press("s")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            assert "writes a checkpoint" in screen_text(app)
            await pilot.press("n")
            await wait_for(pilot, lambda: isinstance(app.screen, TrainingScreen))
            await pilot.pause(0.3)
            assert not any(path.endswith("/stop") for path, _, _ in server.requests)
            # The buttons pressed as a click does, not at screen coordinates: a document arriving
            # after the dialog closed can move the layout between the lookup and a click.
            app.screen.query_one("#stop", Button).press()
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            app.screen.query_one("#confirm-yes", Button).press()
            await wait_for(
                pilot, lambda: any(path == "/api/v1/jobs/train/stop" for path, _, _ in server.requests)
            )
            assert server.requests[-1][2] == "Bearer s3cret"
    finally:
        server.close()


async def test_stop_button_disabled_without_a_training() -> None:
    async with running([fixed_source(documents(2, training=False))]) as (app, pilot):
        await pilot.press("t")
        await wait_for(pilot, lambda: isinstance(app.screen, TrainingScreen))
        assert app.screen.query_one("#stop", Button).disabled
        assert "no training job yet" in screen_text(app)


async def test_two_daemons_give_a_tab_per_job_and_host() -> None:
    one, two = StatusServer(documents(2, training=False)), StatusServer(documents(2))
    try:
        sources = [HttpStatusSource(one.url), HttpStatusSource(two.url)]
        async with running(sources) as (app, pilot):
            tabs = app.screen.query_one(TabbedContent)
            await wait_for(pilot, lambda: len(tabs.query("Tab")) == 3)
            labels = [str(tab.label) for tab in tabs.query("Tab")]
            assert labels[0] == f"extract @ 127.0.0.1:{one.port}"
            assert f"train @ 127.0.0.1:{two.port}" in labels
    finally:
        one.close()
        two.close()


async def test_quit_key_exits() -> None:
    async with running(fixed()) as (app, pilot):
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running)


async def test_every_field_is_validated_inline_and_blocks_launch(tmp_path: Path) -> None:
    server = StatusServer(documents(3, out=extraction_dir(tmp_path), model="embedded"))
    try:
        async with running([HttpStatusSource(server.url, token="s3cret", interval=0.5)]) as (app, pilot):
            await pilot.press("t")
            await wait_for(pilot, lambda: isinstance(app.screen, TrainingScreen))
            screen = app.screen
            assert not any(box.display for box in screen.query(".error"))  # the prefill is valid
            bad = {
                "epochs": "0",
                "lr": "fast",
                "batch_tokens": "-5",
                "ttt_length": "100",
                "draft_vocab_size": "1.5",
                "gpus": "0",
                "data_dir": str(tmp_path / "nowhere"),
                "target_model": str(tmp_path / "no-model"),
                "out_dir": "",
            }
            for name, value in bad.items():
                screen.query_one(f"#field-{name}", Input).value = value
            for name in bad:
                error = screen.query_one(f"#error-{name}", Static)
                await wait_for(pilot, lambda error=error: error.display)
                assert str(error.render()).strip(), name
            assert "must be at least 1" in str(screen.query_one("#error-epochs", Static).render())
            await pilot.press("l")
            await pilot.pause(0.3)
            assert server.requests == []
            screen.query_one("#field-epochs", Input).value = "2"
            await wait_for(pilot, lambda: not screen.query_one("#error-epochs", Static).display)
            await pilot.press("ctrl+r")  # back to the job's defaults
            await wait_for(pilot, lambda: not any(box.display for box in screen.query(".error")))
    finally:
        server.close()


async def test_typing_in_a_field_and_escape_returns_the_keys() -> None:
    async with running(fixed()) as (app, pilot):
        await pilot.press("t")
        await wait_for(pilot, lambda: isinstance(app.screen, TrainingScreen))
        await laid_out(pilot)
        await pilot.click("#field-epochs")
        box = app.screen.query_one("#field-epochs", Input)
        box.value = ""
        await pilot.press("3", "o")  # 'o' is text here, not "overview"
        assert box.value == "3o" and isinstance(app.screen, TrainingScreen)
        await pilot.press("escape", "o")
        await wait_for(pilot, lambda: isinstance(app.screen, OverviewScreen))


async def test_the_process_table_fits_what_it_shows_now_not_what_it_showed() -> None:
    """A process seen alive with wide figures, then gone, shows as the same table as one only seen
    gone: what a snapshot shows must not depend on how many documents the TUI rendered on the way."""
    from textual.app import App, ComposeResult

    from hsmon.tui.widgets.processes import ProcessTable

    alive = {"processes": [{"role": "extractor", "pid": 4242, "alive": True, "status": "sleeping",
                            "cpu_percent": 99.5, "rss_bytes": 123_456_789_012, "uptime_s": 987_654,
                            "restarts": 0}]}  # fmt: skip
    gone = {"processes": [{"role": "extractor", "pid": 4242, "alive": False, "status": "gone"}]}

    class OneTable(App):
        def compose(self) -> ComposeResult:
            yield ProcessTable()

    screens = []
    for history in ([alive, gone], [gone]):
        app = OneTable()
        async with app.run_test(size=(80, 8)) as pilot:
            table = app.query_one(ProcessTable)
            for job in history:
                table.show(typed_job(job))
                await pilot.pause()
            screens.append((table.widths, [table.render_line(y).text for y in range(table.size.height)]))
    assert screens[0] == screens[1], screens


async def test_the_process_table_repaints_a_changed_figure_on_screen() -> None:
    """A document that changes one figure of one process (its CPU %) repaints that line only, and the
    screen shows the new figure in the row of that process, the other rows as they were."""
    from textual.app import App, ComposeResult

    from hsmon.tui.widgets.processes import ProcessTable

    def job(cpu: float) -> dict:
        return {"processes": [
            {"role": "extractor", "pid": 4242, "alive": True, "status": "sleeping", "cpu_percent": cpu,
             "rss_bytes": 15_300_000, "uptime_s": 130, "restarts": 0},
            {"role": "server", "pid": 4243, "alive": True, "status": "running", "cpu_percent": 50.0,
             "rss_bytes": 1_300_000, "uptime_s": 30, "restarts": 1}]}

    class OneTable(App):
        def compose(self) -> ComposeResult:
            yield ProcessTable()

    app = OneTable()
    async with app.run_test(size=(80, 8)) as pilot:
        table = app.query_one(ProcessTable)
        table.show(typed_job(job(5.0)))
        await pilot.pause()
        before = [strip.text for strip in app.screen._compositor.render_strips()]
        table.show(typed_job(job(7.0)))
        assert table._repaint_regions and not table._layout_required  # a line, not the table
        await pilot.pause()
        after = [strip.text for strip in app.screen._compositor.render_strips()]
    changed = [i for i, (old, new) in enumerate(zip(before, after, strict=True)) if old != new]
    assert len(changed) == 1, (before, after)
    assert "extractor" in after[changed[0]] and "7%" in after[changed[0]] and "5%" in before[changed[0]]
    assert any("server" in line and "50%" in line for line in after)


async def test_a_job_the_daemon_retires_leaves_the_tabs() -> None:
    """After a reload removed a job (and its grace ended), the daemon's document no longer holds
    it: its tab goes, the others stay."""
    docs = documents(4)
    later = [{**doc, "jobs": [j for j in doc["jobs"] if j["job"] != "train"]} for doc in docs[2:]]
    server = StatusServer(docs[:2] + later)
    gc.collect()
    earlier = [t for t in gc.get_objects() if isinstance(t, ContentTab)]  # other tests' apps
    try:
        async with running([HttpStatusSource(server.url, interval=0.2)]) as (app, pilot):
            tabs = app.screen.query_one(TabbedContent)
            await wait_for(pilot, lambda: [str(t.label) for t in tabs.query("Tab")] == ["extract"])
            assert "extract" in screen_text(app)
            assert sorted(app.histories) == [(0, "extract")]  # its figures went with it (memory)
            # nothing holds the removed tab (Textual's query caches kept each retired job's tab
            # and its rendered lines: the TUI grew with every job it had seen)
            def kept() -> list[ContentTab]:
                gc.collect()
                known = {id(t) for t in (*earlier, *app.screen.query(ContentTab))}
                return [t for t in gc.get_objects() if isinstance(t, ContentTab) and id(t) not in known]

            await wait_for(pilot, lambda: not kept(), timeout=5)
    finally:
        server.close()


async def test_jobs_that_come_and_go_between_documents_keep_the_tabs_in_step() -> None:
    """Documents arrive while a retired job's tab is being removed (an await): the tabs follow
    the newest document (the overview read the app's jobs twice and raised IndexError when a
    document with fewer jobs came in between)."""
    base = documents(1, training=False)[0]
    churn = []
    for step in range(120):
        jobs = [{**base["jobs"][0], "job": f"job-{i:03d}"} for i in range(max(0, step - 3), step + 1)
                if i % 5 or step % 2]  # one job in five blinks: fewer jobs, then more
        churn.append({**base, "generated_ts": base["generated_ts"] + step, "jobs": jobs})
    async with running([fixed_source(churn, label="churn", interval=0.005)]) as (app, pilot):
        tabs = app.screen.query_one(TabbedContent)
        last = [job["job"] for job in churn[-1]["jobs"]]
        await wait_for(pilot, lambda: [str(t.label) for t in tabs.query("Tab")] == last, timeout=20)


async def test_a_retired_jobs_tab_is_freed_at_once_not_at_the_next_full_collection() -> None:
    """A removed tab is a reference cycle holding every line it drew; left to Python's oldest
    generation, the real TUI held hundreds of thousands of them (RSS 48 -> 218 MB over 155 jobs)."""
    docs = documents(4)
    later = [{**doc, "jobs": [j for j in doc["jobs"] if j["job"] != "train"]} for doc in docs[2:]]
    server = StatusServer(docs[:2] + later * 20)
    try:
        async with running([HttpStatusSource(server.url, interval=0.3)]) as (app, pilot):
            tabs = app.screen.query_one(TabbedContent)
            await wait_for(pilot, lambda: len(tabs.query(TabPane)) == 2, timeout=5)
            pane = weakref.ref(next(p for p in tabs.query(TabPane) if "train" in (p.id or "")))
            gc.disable()  # as for a long-lived tab in the oldest generation: no collection comes soon
            try:
                await wait_for(pilot, lambda: len(tabs.query(TabPane)) == 1, timeout=5)
                # freed by the overview's own collections (automatic ones are off), within a second
                await wait_for(pilot, lambda: pane() is None, timeout=3)
            finally:
                gc.enable()
    finally:
        server.close()

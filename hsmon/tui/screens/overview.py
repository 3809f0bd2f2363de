"""The overview: which sources answer, then a tab per job with everything about it."""

from __future__ import annotations

import gc
import re
import time
import weakref
from typing import ClassVar

from textual._styles_cache import StylesCache
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Header, Static, TabbedContent, TabPane

from hsmon.status_doc import logs_of
from hsmon.tui.screens.event_detail import EventDetailScreen
from hsmon.tui.screens.logs import LogScreen
from hsmon.tui.widgets.compact_footer import compact_footer
from hsmon.tui.widgets.connection_bar import ConnectionBar
from hsmon.tui.widgets.event_log import EventLog
from hsmon.tui.widgets.job_overview import JobOverview

GC_SPACING_S = 5.0
COLLECT_ATTEMPTS = 4  # full collections for one retirement while its tab is still held
COLLECT_RETRY_S = 0.25


def pane_id(key: tuple[int, str]) -> str:
    return f"job-{key[0]}-{re.sub(r'[^A-Za-z0-9_-]', '_', key[1])}"


class OverviewScreen(Screen[None]):
    """A tab per job (per job and host with several daemons)."""

    BINDINGS: ClassVar = [
        Binding("f", "cycle_filter", "filter", show=False),  # the events panel's title says it
        Binding("slash", "search", "search", key_display="/"),
        Binding("e", "open_event", "event", show=False),
        Binding("l", "logs", "logs"),
        Binding("n", "next_tab", "next job"),
        Binding("p", "previous_tab", "prev job", show=False),
        # the panels below the first screen (the page scrolls): without the focus anywhere
        Binding("pagedown,space", "scroll_page(1)", "more", key_display="pgdn"),
        Binding("pageup", "scroll_page(-1)", "back", show=False),
        Binding("home", "scroll_to(0)", "top", show=False),
        Binding("end", "scroll_to(-1)", "bottom", show=False),
    ]

    _ensured: list[str] | None = None
    _last_gc = float("-inf")
    _removed: tuple[weakref.ref[TabPane], ...] = ()  # removed tabs not yet freed

    def compose(self) -> ComposeResult:
        yield Header(icon="◉")
        yield ConnectionBar(id="connections")
        yield Static("waiting for the first status…", id="empty")
        yield TabbedContent(id="jobs")
        yield compact_footer()

    async def on_mount(self) -> None:
        self.query_one("#jobs", TabbedContent).display = False
        self.watch(self.app, "revision", self.refresh_from_app, init=False)
        await self.refresh_from_app()

    async def on_screen_resume(self) -> None:
        await self.refresh_from_app()

    @property
    def _app(self):  # the HsmonApp, typed loosely to avoid an import cycle
        return self.app

    async def _ensure_panes(self) -> None:
        # One reading of the app's jobs: a document may arrive while a pane is removed or added
        # (each an await), and a second reading would no longer match ``ordered``.
        keys = [key for key, _job, _doc in self._app.jobs()]
        ordered = [pane_id(key) for key in keys]
        if ordered == self._ensured:  # the same jobs as at the last document: nothing to add
            return
        tabs = self.query_one("#jobs", TabbedContent)
        existing = {pane.id for pane in tabs.query(TabPane)}
        gone = sorted(existing - set(ordered))
        for pane in gone:  # a job the daemon no longer watches
            widget = next((p for p in tabs.query(TabPane) if p.id == pane), None)
            if widget is not None:
                self._removed = (*self._removed, weakref.ref(widget))
            await tabs.remove_pane(pane)
            existing.discard(pane)
        if gone:
            self._forget_removed_nodes()
        for index, key in enumerate(keys):
            pid = ordered[index]
            if pid not in existing:
                # Tabs keep the order of the sources, whichever daemon answers first.
                later = next((p for p in ordered[index + 1:] if p in existing), None)
                existing.add(pid)
                await tabs.add_pane(TabPane(self._app.tab_label(key), JobOverview(key), id=pid), before=later)
        if existing:
            tabs.display = True
            self.query_one("#empty", Static).display = False
        self._ensured = ordered

    def _forget_removed_nodes(self) -> None:
        """Empty the query caches that still hold removed tabs. Textual caches every `query_one`
        by id on the node asked (up to 1024 entries each, keyed by the DOM's update count, so an
        entry is never hit again once the DOM changes), and removing a widget clears only its own
        cache: its parents' caches kept each retired job's tab with all its rendered lines (the
        soak bench's TUI grew with the jobs it had seen). Likewise Textual's `lru_cache` of
        background styles, keyed by each widget's styles cache (1024 entries, each holding the
        lines a widget rendered last)."""
        for node in (self, *self.walk_children()):
            cache = getattr(node, "_query_one_cache", None)  # Textual >= 6; the floor (5.0.1) lacks it
            if cache is not None:
                cache.clear()
        # Textual >= 6 (5.0.1, the floor, has no get_inner_outer: `make test-floors` met it)
        getattr(getattr(StylesCache, "get_inner_outer", None), "cache_clear", lambda: None)()
        # A removed widget is a reference cycle (parent, styles, message pump) holding every line
        # it drew (Strips, each with its caches); its tab had lived long enough to be in the oldest
        # generation, which Python collects rarely: the real TUI held up to 860k objects of retired
        # tabs (FIFOCache 270k, Strip 38k) and its RSS stayed at that high-water mark. Collect now,
        # at most once every GC_SPACING_S (a full collection took ~110 ms with a job retiring a
        # second): a tab left waiting is freed at the next retirement after that.
        now = time.monotonic()
        if now - self._last_gc >= GC_SPACING_S:
            self._last_gc = now
            # after the next refresh: until then the last frame's map still holds the removed tab
            self.call_after_refresh(self._collect_removed, COLLECT_ATTEMPTS)

    def _collect_removed(self, attempts: int) -> None:
        """A full collection; while a removed tab outlives it (still held by a frame or a message
        in flight), another one a little later, at most ``attempts`` in all."""
        gc.collect()
        self._removed = tuple(ref for ref in self._removed if ref() is not None)
        if self._removed and attempts > 1:
            again = attempts - 1
            self.set_timer(COLLECT_RETRY_S, lambda: self.call_after_refresh(self._collect_removed, again))

    async def refresh_from_app(self) -> None:
        """Show the app's latest documents (only the visible tab is redrawn)."""
        if not self.is_current:
            return
        self.query_one("#connections", ConnectionBar).show(self._app.connection_states())
        await self._ensure_panes()
        tabs = self.query_one("#jobs", TabbedContent)
        active = tabs.active
        if not active:
            return
        for key, job, doc in self._app.jobs():
            if pane_id(key) == active:
                self._app.selected = key
                overview = tabs.get_pane(active).query_one(JobOverview)
                overview.show(job, self._app.history(key), doc.generated_ts,
                              self._app.stale_note(key[0]), doc.gpus)
                break

    async def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        await self.refresh_from_app()

    def _active_overview(self) -> JobOverview | None:
        tabs = self.query_one("#jobs", TabbedContent)
        if not tabs.active:
            return None
        return tabs.get_pane(tabs.active).query_one(JobOverview)

    def action_cycle_filter(self) -> None:
        overview = self._active_overview()
        if overview is not None:
            overview.query_one(EventLog).cycle_filter()

    def action_logs(self) -> None:
        """The selected job's log, tailed (hsmon/tui/screens/logs.py)."""
        key = self._app.selected
        job = self._app.job(key)
        if key is None or job is None:
            self.app.notify("no job selected", severity="warning")
            return
        self.app.push_screen(LogScreen(job.job, logs_of(job), self._app.sources[key[0]].is_local))

    def action_search(self) -> None:
        overview = self._active_overview()
        if overview is not None:
            overview.query_one(EventLog).start_search()

    def action_scroll_page(self, pages: int) -> None:
        overview = self._active_overview()
        if overview is not None:
            page = max(1, overview.scrollable_content_region.height - 2)
            overview.scroll_to(y=overview.scroll_y + pages * page, animate=False)

    def action_scroll_to(self, where: int) -> None:
        overview = self._active_overview()
        if overview is not None:
            overview.scroll_to(y=0 if where == 0 else overview.max_scroll_y, animate=False)

    def on_event_log_open_event(self, message: EventLog.OpenEvent) -> None:
        message.stop()
        self.app.push_screen(EventDetailScreen(message.event, message.now))

    def action_open_event(self) -> None:
        overview = self._active_overview()
        if overview is not None:
            log = overview.query_one(EventLog)
            log.open_event(log.current_event())

    def _move_tab(self, step: int) -> None:
        tabs = self.query_one("#jobs", TabbedContent)
        ids = [pane.id for pane in tabs.query(TabPane)]
        if ids and tabs.active in ids:
            tabs.active = ids[(ids.index(tabs.active) + step) % len(ids)]

    def action_next_tab(self) -> None:
        self._move_tab(1)

    def action_previous_tab(self) -> None:
        self._move_tab(-1)

"""The job's events as one human line each, with its clock time: filtered (all, errors, rejects,
+heartbeats), searched (`/`: the lines that hold the text), scrolled (arrows, page up/down, home,
end, the mouse wheel once the log has the focus: tab, or a click).

A line is an option of a list: enter (or a click, or `e` for the highlighted or newest line)
opens the whole event.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any, ClassVar

from rich.cells import cell_len, set_cell_size
from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.geometry import Region, Size
from textual.markup import escape
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Input

from hsmon.status_doc import JobStatus
from hsmon.tui.event_text import EVENT_FILTERS, event_clock, event_summary, filtered_events
from hsmon.tui.widgets.quiet import QuietStatic, WholeCellScrollBar

KIND_STYLES = {"error": "bold red", "retry": "yellow", "reject": "magenta", "state": "bold cyan",
               "pause": "bold magenta", "done": "bold green", "stopped": "bold blue", "chunk": "green",
               "checkpoint": "green", "eval": "bold", "heartbeat": "dim"}
REVERSE = Style(reverse=True)
MAX_EVENTS = 200  # the status document carries the last 20; the app keeps more (JobHistory)


class FilterBar(QuietStatic):
    """'show: (all) errors rejects +heartbeats  /: search', each word clickable."""

    def show(self, which: str, search: str = "", found: int | None = None) -> None:
        parts = [Content("show: ")]
        for name in EVENT_FILTERS:
            style = "bold reverse" if name == which else "underline"
            parts.append(Content.from_markup(f"[{style} @click=set_filter('{name}')] {name} [/] "))
        if search:
            parts.append(Content.from_markup(f"[bold] /{escape(search)}[/] [dim]({found} found, "
                                             "escape clears)[/]"))
        else:
            parts.append(Content.from_markup("[dim] /: search  enter/e: whole event[/]"))
        self.update(Content("").join(parts), layout=False)

    def action_set_filter(self, which: str) -> None:
        log = self.parent
        if isinstance(log, EventLog):
            log.which = which


class EventLines(ScrollView, can_focus=True):
    """The lines themselves, drawn line by line (only the visible ones): new figures every second
    redraw this widget alone, never the screen's layout. Up/down/home/end move a highlight,
    enter or a click opens the line's event."""

    BINDINGS: ClassVar = [
        Binding("up", "move(-1)", "up", show=False),
        Binding("down", "move(1)", "down", show=False),
        Binding("home", "move_to(0)", "first", show=False),
        Binding("end", "move_to(-1)", "last", show=False),
        Binding("pageup", "page(-1)", "page up", show=False),
        Binding("pagedown", "page(1)", "page down", show=False),
        Binding("enter", "select", "open", show=False),
    ]
    DEFAULT_CSS = """
    EventLines { height: 1fr; scrollbar-size-horizontal: 0; }
    EventLines:focus { background-tint: $foreground 3%; }
    """

    class Selected(Message):
        def __init__(self, index: int) -> None:
            super().__init__()
            self.index = index

    highlighted: reactive[int | None] = reactive(None)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._count = 0
        self._pass: tuple[int, int, Style] | None = None
        self._make: Callable[[int], tuple[str, str]] = lambda index: ("", "")

    def set_lines(self, count: int, make: Callable[[int], tuple[str, str]], follow: bool) -> None:
        """Show ``count`` lines, line i being ``make(i)``: (text, style), made when drawn (only the
        visible ones); ``follow`` keeps the newest (last) in view."""
        self._count, self._make = count, make
        if self.virtual_size.height != count:
            rows = self.scrollable_content_region.height
            if rows and self.show_vertical_scrollbar and self.virtual_size.height > rows and count > rows:
                # The scrollbar stays: only its thumb changes, not the layout (a layout pass repaints
                # the whole screen; it ran at every document while the log filled up).
                self.set_reactive(EventLines.virtual_size, Size(0, count))
                self._scroll_update(self.virtual_size)
            else:
                self.virtual_size = Size(0, count)
        if follow:  # once the new height is known
            self.call_after_refresh(self.scroll_end, animate=False, immediate=True)
        self.refresh()

    @property
    def line_count(self) -> int:
        return self._count

    def line_text(self, index: int) -> str:
        return self._make(index)[0]

    def render_lines(self, crop: Region) -> list[Strip]:
        # The offset, width and base style once per pass, not per line: each walks the DOM (the
        # base style every ancestor's styles), which was two thirds of the log's render cost.
        self._pass = (self.scroll_offset.y, self.scrollable_content_region.width, self.rich_style)
        try:
            return super().render_lines(crop)
        finally:
            self._pass = None

    def render_line(self, y: int) -> Strip:
        offset, width, style = self._pass or (
            self.scroll_offset.y, self.scrollable_content_region.width, self.rich_style)
        index = offset + y
        if index >= self._count:
            return Strip.blank(width, style)
        plain, line_style = self._make(index)
        return line_strip(plain, line_style, index == self.highlighted, width, style)

    def watch_highlighted(self, index: int | None) -> None:
        if index is not None:
            self.scroll_to_region(Region(0, index, 1, 1), animate=False)
        self.refresh()

    def action_move(self, step: int) -> None:
        if self._count:
            start = self._count if self.highlighted is None else self.highlighted
            self.highlighted = max(0, min(self._count - 1, start + step))

    def action_move_to(self, index: int) -> None:
        if self._count:
            self.highlighted = index % self._count

    def action_page(self, pages: int) -> None:
        self.action_move(pages * max(1, self.scrollable_content_region.height - 1))

    def action_select(self) -> None:
        if self.highlighted is not None:
            self.post_message(self.Selected(self.highlighted))

    def on_click(self, event: events.Click) -> None:
        index = self.scroll_offset.y + event.y
        if 0 <= index < self._count:
            self.highlighted = index
            self.post_message(self.Selected(index))


@lru_cache(maxsize=64)
def _style(name: str, highlighted: bool) -> Style | None:
    style = Style.parse(name) if name else None
    if highlighted:
        style = style + REVERSE if style else REVERSE
    return style


def line_strip(plain: str, name: str, highlighted: bool, width: int, base: Style) -> Strip:
    """One line of the log, ``plain`` in style ``name`` cut to ``width`` with an ellipsis: the
    segments rich's Text would render (text.stylize(name), truncate, render), built directly, since
    the log's lines are drawn again every second (their ages move)."""
    if "\n" in plain:  # not a line: let rich lay it out
        text = Text(plain)
        text.stylize(name)
        if highlighted:
            text.stylize("reverse")
        text.truncate(width, overflow="ellipsis")
        strip = Strip(text.render(Console(width=max(1, width))), text.cell_len)
    else:
        if cell_len(plain) > width:
            plain = set_cell_size(plain, width - 1) + "…"
        # What Strip([...]).extend_cell_length(width, base).apply_style(base) gives, in one strip.
        style, length = _style(name, highlighted), cell_len(plain)
        segments = [Segment(plain, base + style if style else base)] if plain else []
        if width > length:
            segments.append(Segment(" " * (width - length), base))
        return Strip(segments, max(width, length))
    return strip.extend_cell_length(width, base).apply_style(base)


def _event_key(event: dict[str, Any]) -> tuple[Any, ...]:
    return (event.get("ts"), event.get("kind"), event.get("job"))


class SearchInput(Input):
    """The event log's search: the lines that hold the text are shown as it is typed."""

    BINDINGS: ClassVar = [Binding("escape", "clear", "clear search", show=False)]
    DEFAULT_CSS = "SearchInput { height: 1; border: none; padding: 0 1; display: none; }"

    def action_clear(self) -> None:
        log = self.parent
        if isinstance(log, EventLog):
            log.end_search(clear=True)


class EventLog(Vertical):
    """Newest events at the bottom; the filter: click a word of the filter bar, or `f` (cycles);
    `/` searches."""

    DEFAULT_CSS = """
    EventLog { height: auto; }
    EventLog FilterBar { height: 1; }
    """

    which: reactive[str] = reactive("all")
    search: reactive[str] = reactive("")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._events: list[dict[str, Any]] = []
        self._chosen: list[dict[str, Any]] = []
        self._now: float | None = None
        self._shown: tuple[Any, ...] | None = None
        self._summaries: dict[tuple[Any, ...], str] = {}

    def compose(self) -> ComposeResult:
        yield FilterBar(id="event-filter")
        yield SearchInput(placeholder="search the events (enter keeps it, escape clears)", id="event-search")
        yield EventLines(id="event-lines")

    def start_search(self) -> None:
        """`/`: the search field, focused."""
        field = self.query_one(SearchInput)
        field.display = True
        field.focus()

    def end_search(self, clear: bool) -> None:
        field = self.query_one(SearchInput)
        if clear:
            field.value = ""
            self.search = ""
        field.display = False
        self.query_one(EventLines).focus()

    def on_input_changed(self, message: Input.Changed) -> None:
        message.stop()
        if message.value.startswith("/"):  # the key that opened the field reaches it too
            message.input.value = message.value[1:]
            return
        self.search = message.value

    def on_input_submitted(self, message: Input.Submitted) -> None:
        message.stop()
        self.end_search(clear=False)

    def watch_search(self) -> None:
        self._render_lines()

    def on_mount(self) -> None:
        self.query_one(FilterBar).show(self.which, self.search)
        # whole cells: the default thumb ends in half-block glyphs (a stray '▃▃' at the panel's edge)
        self.query_one(EventLines).vertical_scrollbar.renderer = WholeCellScrollBar

    def cycle_filter(self) -> None:
        """Next filter (all → errors → rejects → +heartbeats → all)."""
        self.which = EVENT_FILTERS[(EVENT_FILTERS.index(self.which) + 1) % len(EVENT_FILTERS)]

    def watch_which(self) -> None:
        self._render_lines()

    def show(self, job: JobStatus, now_ts: float | None,
             kept: list[dict[str, Any]] | None = None) -> None:
        """Show ``kept`` (the events kept across documents) or else the document's recent events."""
        self._events = kept or job.recent_events
        self._now = now_ts
        self._render_lines()

    def _render_lines(self) -> None:
        if not self.is_mounted:
            return
        summaries = self._summaries

        def summary(event: dict[str, Any]) -> str:
            key = _event_key(event)
            if key not in summaries:
                summaries[key] = event_summary(event)
            return summaries[key]

        chosen = filtered_events(self._events, self.which, MAX_EVENTS, self.search, summary)
        key = (self.which, self.search, tuple(_event_key(e) for e in chosen))
        if key == self._shown:
            return
        self._shown = key
        self.query_one(FilterBar).show(self.which, self.search, len(chosen))
        lines = self.query_one(EventLines)
        highlighted = lines.highlighted
        keep = _event_key(self._chosen[highlighted]) if highlighted is not None and highlighted < len(
            self._chosen) else None
        self._chosen = chosen
        kept = {_event_key(e) for e in self._events}
        self._summaries = {k: v for k, v in summaries.items() if k in kept}  # computed once per event
        what = "" if self.which in ("all", "+heartbeats") else self.which + " "
        none = f"no event holds {self.search!r}" if self.search else f"no {what}events yet"

        def make(index: int) -> tuple[str, str]:
            if not chosen:
                return none, "dim"
            event = chosen[index]
            return (f"{event_clock(event)} {summary(event)}", KIND_STYLES.get(str(event.get("kind")), ""))

        keys = [_event_key(e) for e in chosen]
        highlight = keys.index(keep) if keep is not None and keep in keys else None
        lines.set_lines(max(1, len(chosen)), make, follow=highlight is None)
        lines.highlighted = highlight

    def current_event(self) -> dict[str, Any] | None:
        """The highlighted event, else the newest shown."""
        highlighted = self.query_one(EventLines).highlighted
        if highlighted is not None and highlighted < len(self._chosen):
            return self._chosen[highlighted]
        return self._chosen[-1] if self._chosen else None

    def on_event_lines_selected(self, message: EventLines.Selected) -> None:
        message.stop()
        if message.index < len(self._chosen):
            self.open_event(self._chosen[message.index])

    class OpenEvent(Message):
        """Show one event whole (the screen that holds the log opens the detail screen)."""

        def __init__(self, event: dict[str, Any], now: float | None) -> None:
            super().__init__()
            self.event, self.now = event, now

    def open_event(self, event: dict[str, Any] | None) -> None:
        if event is not None:
            self.post_message(self.OpenEvent(event, self._now))

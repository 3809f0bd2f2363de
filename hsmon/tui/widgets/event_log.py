"""The tail of the job's events as one human line each, filtered: all, errors, rejects, +heartbeats.

A line is an option of a list: enter (or a click, or `e` for the highlighted or newest line)
opens the whole event.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.reactive import reactive
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from hsmon.tui.event_text import EVENT_FILTERS, event_line, filtered_events
from hsmon.tui.widgets.quiet import QuietStatic

KIND_STYLES = {"error": "bold red", "retry": "yellow", "reject": "magenta", "state": "bold cyan",
               "pause": "bold magenta", "done": "bold green", "stopped": "bold blue", "chunk": "green",
               "checkpoint": "green", "eval": "bold", "heartbeat": "dim"}
MAX_EVENTS = 200  # the status document carries the last 20; the app keeps more (JobHistory)


class FilterBar(QuietStatic):
    """'show: (all) errors rejects +heartbeats', each word clickable."""

    def show(self, which: str) -> None:
        parts = [Content("show: ")]
        for name in EVENT_FILTERS:
            style = "bold reverse" if name == which else "underline"
            parts.append(Content.from_markup(f"[{style} @click=set_filter('{name}')] {name} [/] "))
        parts.append(Content.from_markup("[dim] enter/e: whole event[/]"))
        self.update(Content("").join(parts), layout=False)

    def action_set_filter(self, which: str) -> None:
        log = self.parent
        if isinstance(log, EventLog):
            log.which = which


class EventLines(OptionList):
    """The lines themselves; newest at the bottom, kept in view unless a line is highlighted."""

    DEFAULT_CSS = """
    EventLines { height: 1fr; border: none; padding: 0; text-wrap: nowrap; text-overflow: ellipsis;
                 background: transparent; }
    EventLines:focus { border: none; background-tint: $foreground 3%; }
    """


def _event_key(event: dict[str, Any]) -> tuple[Any, ...]:
    return (event.get("ts"), event.get("kind"), event.get("job"))


class EventLog(Vertical):
    """Newest events at the bottom; the filter: click a word of the filter bar, or `f` (cycles)."""

    DEFAULT_CSS = """
    EventLog { height: auto; }
    EventLog FilterBar { height: 1; }
    """

    which: reactive[str] = reactive("all")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._events: list[dict[str, Any]] = []
        self._chosen: list[dict[str, Any]] = []
        self._now: float | None = None
        self._shown: tuple[Any, ...] | None = None

    def compose(self) -> ComposeResult:
        yield FilterBar(id="event-filter")
        yield EventLines(id="event-lines")

    def on_mount(self) -> None:
        self.query_one(FilterBar).show(self.which)

    def cycle_filter(self) -> None:
        """Next filter (all → errors → rejects → +heartbeats → all)."""
        self.which = EVENT_FILTERS[(EVENT_FILTERS.index(self.which) + 1) % len(EVENT_FILTERS)]

    def watch_which(self) -> None:
        if self.is_mounted:
            self.query_one(FilterBar).show(self.which)
        self._render_lines()

    def show(self, job: dict[str, Any], now_ts: float | None,
             kept: list[dict[str, Any]] | None = None) -> None:
        """Show ``kept`` (the events kept across documents) or else the document's recent events."""
        self._events = kept or job.get("recent_events") or []
        self._now = now_ts
        self._render_lines()

    def _render_lines(self) -> None:
        if not self.is_mounted:
            return
        chosen = filtered_events(self._events, self.which, MAX_EVENTS)
        key = (self.which, self._now, tuple(_event_key(e) for e in chosen))
        if key == self._shown:
            return
        self._shown = key
        lines = self.query_one(EventLines)
        highlighted = lines.highlighted
        keep = _event_key(self._chosen[highlighted]) if highlighted is not None and highlighted < len(
            self._chosen) else None
        self._chosen = chosen
        options: list[Option] = []
        for event in chosen:
            text = Text(event_line(event, self._now), style=KIND_STYLES.get(str(event.get("kind")), ""))
            options.append(Option(text))
        if not chosen:
            what = "" if self.which in ("all", "+heartbeats") else self.which + " "
            options.append(Option(Text(f"no {what}events yet", style="dim"), disabled=True))
        lines.clear_options()
        lines.add_options(options)
        keys = [_event_key(e) for e in chosen]
        if keep is not None and keep in keys:
            lines.highlighted = keys.index(keep)
        else:
            lines.call_after_refresh(lines.scroll_end, animate=False, immediate=True)

    def current_event(self) -> dict[str, Any] | None:
        """The highlighted event, else the newest shown."""
        highlighted = self.query_one(EventLines).highlighted
        if highlighted is not None and highlighted < len(self._chosen):
            return self._chosen[highlighted]
        return self._chosen[-1] if self._chosen else None

    def on_option_list_option_selected(self, message: OptionList.OptionSelected) -> None:
        message.stop()
        if message.option_index < len(self._chosen):
            self.open_event(self._chosen[message.option_index])

    def open_event(self, event: dict[str, Any] | None) -> None:
        from hsmon.tui.screens.event_detail import EventDetailScreen

        if event is not None:
            self.app.push_screen(EventDetailScreen(event, self._now))

"""The tail of the job's events, filtered: all, errors, rejects."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.reactive import reactive

from hsmon.tui.view import EVENT_FILTERS, event_line, filtered_events
from hsmon.tui.widgets.quiet import QuietStatic

KIND_STYLES = {"error": "bold red", "retry": "yellow", "reject": "magenta", "state": "bold cyan",
               "pause": "bold magenta", "done": "bold green", "stopped": "bold blue", "chunk": "green",
               "checkpoint": "green"}


class FilterBar(QuietStatic):
    """'show: (all) errors rejects', each word clickable."""

    def show(self, which: str) -> None:
        parts = [Content("show: ")]
        for name in EVENT_FILTERS:
            style = "bold reverse" if name == which else "underline"
            parts.append(Content.from_markup(f"[{style} @click=set_filter('{name}')] {name} [/] "))
        self.update(Content("").join(parts), layout=False)

    def action_set_filter(self, which: str) -> None:
        log = self.parent
        if isinstance(log, EventLog):
            log.which = which


class EventLog(Vertical):
    """Newest events at the bottom; the filter: click a word of the filter bar, or `f` (cycles)."""

    DEFAULT_CSS = """
    EventLog { height: auto; }
    EventLog FilterBar { height: 1; }
    EventLog #event-lines { height: auto; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    which: reactive[str] = reactive("all")

    def __init__(self, lines: int = 8, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_lines = lines
        self._events: list[dict[str, Any]] = []
        self._now: float | None = None
        self._shown: tuple[Any, ...] | None = None

    def compose(self) -> ComposeResult:
        yield FilterBar(id="event-filter")
        yield QuietStatic("", id="event-lines")

    def on_mount(self) -> None:
        self.query_one(FilterBar).show(self.which)

    def cycle_filter(self) -> None:
        """Next filter (all → errors → rejects → all)."""
        self.which = EVENT_FILTERS[(EVENT_FILTERS.index(self.which) + 1) % len(EVENT_FILTERS)]

    def watch_which(self) -> None:
        if self.is_mounted:
            self.query_one(FilterBar).show(self.which)
        self._render_lines()

    def show(self, job: dict[str, Any], now_ts: float | None) -> None:
        self._events = job.get("recent_events") or []
        self._now = now_ts
        self._render_lines()

    def _render_lines(self) -> None:
        if not self.is_mounted:
            return
        chosen = filtered_events(self._events, self.which, self.max_lines)
        key = (self.which, self._now, len(self._events), tuple(e.get("ts") for e in chosen[-1:]))
        if key == self._shown:
            return
        self._shown = key
        text = Text()
        if not chosen:
            text.append(f"no {'' if self.which == 'all' else self.which + ' '}events yet", style="dim")
        for i, event in enumerate(chosen):
            if i:
                text.append("\n")
            text.append(event_line(event, self._now), style=KIND_STYLES.get(str(event.get("kind")), ""))
        text.no_wrap = True
        text.overflow = "ellipsis"
        self.query_one("#event-lines", QuietStatic).show_text(text)

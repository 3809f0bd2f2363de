"""The tail of the job's events, filtered: all, errors, rejects."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.widgets import RadioButton, RadioSet, Static

from hsmon.tui.view import EVENT_FILTERS, event_line, filtered_events

KIND_STYLES = {"error": "bold red", "retry": "yellow", "reject": "magenta", "state": "bold cyan",
               "pause": "bold magenta", "done": "bold green", "stopped": "bold blue", "chunk": "green",
               "checkpoint": "green"}


class EventLog(Vertical):
    """Newest events at the bottom; the filter is a radio set (mouse) and the `f` key (cycles)."""

    DEFAULT_CSS = """
    EventLog { height: auto; }
    EventLog > Horizontal { height: auto; }
    EventLog RadioSet { layout: horizontal; border: none; padding: 0; height: 1; width: auto; }
    EventLog RadioSet > RadioButton { width: auto; padding: 0 1 0 0; }
    EventLog #event-lines { height: auto; }
    """

    which: reactive[str] = reactive("all")

    def __init__(self, lines: int = 8, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_lines = lines
        self._events: list[dict[str, Any]] = []
        self._now: float | None = None
        self._shown: tuple[Any, ...] | None = None

    def compose(self) -> ComposeResult:
        with Horizontal(), RadioSet(id="event-filter"):
            for name in EVENT_FILTERS:
                yield RadioButton(name, value=name == "all", id=f"filter-{name}")
        yield Static("", id="event-lines")

    def on_radio_set_changed(self, event: RadioSet.Changed) -> None:
        event.stop()
        self.which = EVENT_FILTERS[event.index]

    def cycle_filter(self) -> None:
        """Next filter (all → errors → rejects → all)."""
        nxt = EVENT_FILTERS[(EVENT_FILTERS.index(self.which) + 1) % len(EVENT_FILTERS)]
        self.query_one(f"#filter-{nxt}", RadioButton).value = True

    def watch_which(self) -> None:
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
        self.query_one("#event-lines", Static).update(text)

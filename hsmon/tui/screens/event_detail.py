"""One event in full: its summary, then every field as JSON (escape closes)."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.syntax import Syntax
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from hsmon.tui.event_text import event_detail


class EventDetailScreen(ModalScreen[None]):
    """The whole event behind a line of the event log."""

    BINDINGS: ClassVar = [Binding("escape,q,e,enter", "close", "close")]

    def __init__(self, event: dict[str, Any], now_ts: float | None) -> None:
        super().__init__()
        self.event = event
        self.now_ts = now_ts

    def compose(self) -> ComposeResult:
        head, _, body = event_detail(self.event, self.now_ts).partition("\n\n")
        with VerticalScroll(id="event-dialog"):
            yield Static(Text(head, style="bold"))
            yield Static(Syntax(body, "json", theme="ansi_dark", word_wrap=True, background_color="default"))
            yield Static(Text("escape closes", style="dim"))

    def action_close(self) -> None:
        self.dismiss(None)

"""A run's end said on screen: a banner (its verdict) over its summary, until the user closes it or
quits; `make demo` shows it when its last step is done (a notice that fades would leave a screen
that waits for `q` without a word)."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


class BannerScreen(ModalScreen[None]):
    """``title`` as a banner (green when ``ok``, else red), then ``lines``; q quits the app, escape
    goes back to the dashboard."""

    BINDINGS: ClassVar = [Binding("escape", "close", "back to the dashboard"), Binding("q", "quit", "quit")]

    def __init__(self, title: str, lines: list[str], ok: bool, closing: str) -> None:
        super().__init__()
        self.title_text, self.lines, self.ok, self.closing = title, lines, ok, closing

    def compose(self) -> ComposeResult:
        style = "bold white on dark_green" if self.ok else "bold white on dark_red"
        with VerticalScroll(id="banner-dialog", classes="" if self.ok else "-failed"):
            yield Static(Text(f" {self.title_text} ", style=style), id="banner-title")
            yield Static(Text("\n".join(self.lines)), id="banner-lines")
            yield Static(Text(self.closing, style="dim"), id="banner-closing")

    def action_close(self) -> None:
        self.dismiss(None)

    def action_quit(self) -> None:
        self.app.exit()

"""The baseline of bench/tui_cpu.py: an empty Textual app with hsmon's header, footer and keys.

Nothing else: no source, no document, no widget between the header and the footer. Its idle CPU
is what Textual itself costs on the same pseudo-terminal; the dashboard's idle is compared to it.

    python bench/_tui_empty_app.py
"""

from __future__ import annotations

from typing import ClassVar

from textual.app import App, ComposeResult
from textual.widgets import Footer, Header

from hsmon.tui.app import HsmonApp
from hsmon.tui.screens.overview import OverviewScreen


class EmptyApp(App[None]):
    """hsmon's title, header and footer (the same keys shown), and nothing in between."""

    TITLE = HsmonApp.TITLE
    SUB_TITLE = HsmonApp.SUB_TITLE
    ENABLE_COMMAND_PALETTE = False
    BINDINGS: ClassVar = [*HsmonApp.BINDINGS, *OverviewScreen.BINDINGS]

    def compose(self) -> ComposeResult:
        yield Header(icon="◉")
        yield Footer()


if __name__ == "__main__":
    EmptyApp().run()

"""One line per dashboard: each source, connected or 'disconnected, retrying'."""

from __future__ import annotations

from rich.text import Text

from hsmon.tui.widgets.quiet import QuietStatic


class ConnectionBar(QuietStatic):
    """Where the figures come from and whether that source answers."""

    DEFAULT_CSS = "ConnectionBar { height: auto; padding: 0 1; }"

    def show(self, states: list[tuple[str, str | None]]) -> None:
        """``states``: (label, error or None) per source."""
        text = Text()
        down = False
        for i, (label, error) in enumerate(states):
            if i:
                text.append("   ")
            if error is None:
                text.append("● ", style="green")
                text.append(label)
            else:
                down = True
                text.append("✖ ", style="bold red")
                text.append(f"{label}: {error}", style="bold red")
        self.set_class(down, "-down")
        self.show_text(text)

"""One line per dashboard: each source, connected, 'disconnected, retrying', or gone after its jobs ended."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text

from hsmon.tui.widgets.quiet import QuietStatic


@dataclass(frozen=True)
class Connection:
    """One source as the bar shows it: ``error`` while it does not answer; ``finished`` when it went
    away after every job it watched had ended (its last figures are final, not stale)."""

    label: str
    error: str | None = None
    finished: str | None = None


class ConnectionBar(QuietStatic):
    """Where the figures come from and whether that source answers."""

    DEFAULT_CSS = "ConnectionBar { height: auto; padding: 0 1; }"

    def show(self, states: list[Connection]) -> None:
        text = Text()
        down = False
        for i, state in enumerate(states):
            label, error = state.label, state.error
            if i:
                text.append("   ")
            if error is None:
                text.append("● ", style="green")
                text.append(label)
            elif state.finished:
                text.append("○ ", style="bold")
                text.append(f"{label}: {state.finished}")
            else:
                down = True
                text.append("✖ ", style="bold red")
                text.append(f"{label}: {error}", style="bold red")
        self.set_class(down, "-down")
        self.show_text(text)

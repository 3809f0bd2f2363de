"""`?`: every key and what it does."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS: tuple[tuple[str, str], ...] = (
    ("o", "overview: a tab per job (and per daemon)"),
    ("t", "training: launch, follow and stop a drafter training"),
    ("n / p", "next / previous job tab (or click a tab)"),
    ("pgdn pgup", "the panels below the screen (space, home, end, wheel)"),
    ("f", "event filter: all → errors → rejects → +heartbeats"),
    ("/", "search the events: lines holding the text (escape clears)"),
    ("e, enter", "the whole event of the highlighted (or newest) line"),
    ("r", "read every source again now"),
    ("l", "overview: the job's log, followed (/, f, n: see its title)"),
    ("", "training screen: launch the training in the form"),
    ("R", "resume from the checkpoint in the form's output directory"),
    ("s", "stop the training after a yes; it writes a checkpoint"),
    ("tab", "into the event log (arrows, pgup/pgdn), fields, buttons"),
    ("escape", "leaves a field"),
    ("ctrl+r", "reset the form to the job's values (training screen)"),
    ("?", "this help (escape closes it)"),
    ("q", "quit; a launched training keeps running"),
)
FOOTNOTE = ("The mouse works too. A daemon that stops answering shows 'disconnected, retrying' "
            "and the dashboard reconnects by itself.")


def help_text() -> Text:
    text = Text("hsmon tui: keys\n\n", style="bold")
    for key, does in KEYS:
        text.append(f"{key:>9}  ", style="bold cyan")
        text.append(f"{does}\n")
    text.append(f"\n{FOOTNOTE}", style="dim")
    return text


class HelpScreen(ModalScreen[None]):
    """The key bindings, in a dialog."""

    BINDINGS: ClassVar = [Binding("escape,question_mark,q", "close", "close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-dialog"):
            yield Static(help_text())

    def action_close(self) -> None:
        self.dismiss(None)

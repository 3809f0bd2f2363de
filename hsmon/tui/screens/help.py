"""`?`: every key and what it does."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

HELP = """\
# hsmon tui

| key | does |
|---|---|
| `o` | overview: a tab per job (and per daemon) |
| `t` | training: launch, follow and stop a drafter training |
| `n` / `p` | next / previous job tab |
| `f` | event log filter: all → errors → rejects |
| `r` | read every source again now |
| `l` | launch the training in the form (training screen) |
| `s` | stop the training, after a confirmation; it writes a checkpoint |
| `?` | this help; `escape` closes it |
| `q` | quit (a launched training keeps running) |

The mouse works too: click tabs, filters, buttons and fields.
A daemon that stops answering shows **disconnected, retrying**; the dashboard
reconnects by itself when it is back.
"""


class HelpScreen(ModalScreen[None]):
    """The key bindings, in a dialog."""

    BINDINGS: ClassVar = [Binding("escape,question_mark,q", "close", "close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-dialog"):
            yield Markdown(HELP)

    def action_close(self) -> None:
        self.dismiss(None)

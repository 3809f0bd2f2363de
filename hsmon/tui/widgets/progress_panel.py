"""Progress bars: rows, tokens, chunks (and rejects beside them)."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Vertical

from hsmon.tui.widgets.meter import Meter


class ProgressPanel(Vertical):
    """Rows, tokens and chunks done against their totals."""

    DEFAULT_CSS = "ProgressPanel { height: auto; }"

    def compose(self) -> ComposeResult:
        yield Meter("rows", id="meter-rows")
        yield Meter("tokens", id="meter-tokens")
        yield Meter("chunks", id="meter-chunks")

    def show(self, job: dict[str, Any]) -> None:
        progress = job.get("progress") or {}
        self.query_one("#meter-rows", Meter).set_value(progress.get("rows_done"), progress.get("rows_total"))
        self.query_one("#meter-tokens", Meter).set_value(progress.get("tokens_done"),
                                                         progress.get("tokens_total"))
        self.query_one("#meter-chunks", Meter).set_value(progress.get("chunks_done"),
                                                         progress.get("chunks_total"))
        rejects = progress.get("rejects")
        self.border_subtitle = f"rejects {rejects}" if rejects else ""

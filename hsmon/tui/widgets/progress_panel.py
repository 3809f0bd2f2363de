"""Progress bars: rows, tokens, chunks (and rejects beside them)."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Vertical

from hsmon.contracts.rejects import short_summary
from hsmon.tui.view import is_acceptance_job
from hsmon.tui.widgets.meter import Meter
from hsmon.tui.widgets.quiet import set_border_subtitle


class ProgressPanel(Vertical):
    """Rows, tokens and chunks done against their totals."""

    DEFAULT_CSS = "ProgressPanel { height: auto; }"

    def compose(self) -> ComposeResult:
        yield Meter("rows", id="meter-rows")
        yield Meter("tokens", id="meter-tokens")
        yield Meter("chunks", id="meter-chunks")

    def show(self, job: dict[str, Any]) -> None:
        progress = job.get("progress") or {}
        rows = self.query_one("#meter-rows", Meter)
        label = "decodes" if is_acceptance_job(job) else "rows"  # eval-drafter counts decodes
        if rows.label != label:
            rows.label = label
            rows.refresh()
        rows.set_value(progress.get("rows_done"), progress.get("rows_total"))
        self.query_one("#meter-tokens", Meter).set_value(progress.get("tokens_done"),
                                                         progress.get("tokens_total"))
        self.query_one("#meter-chunks", Meter).set_value(progress.get("chunks_done"),
                                                         progress.get("chunks_total"))
        rejects = progress.get("rejects")
        why = short_summary(progress.get("rejects_by_reason"))
        set_border_subtitle(self, (f"rejects {rejects}" + (f": {why}" if why else "")) if rejects else "")

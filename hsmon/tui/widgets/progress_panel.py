"""Progress bars: rows, tokens, chunks (and rejects beside them)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical

from hsmon.contracts.rejects import short_summary
from hsmon.status_doc import JobStatus
from hsmon.tui.view import NO_PROGRESS, is_acceptance_job
from hsmon.tui.widgets.meter import Meter
from hsmon.tui.widgets.quiet import set_border_subtitle


class ProgressPanel(Vertical):
    """Rows, tokens and chunks done against their totals."""

    DEFAULT_CSS = "ProgressPanel { height: auto; }"

    def compose(self) -> ComposeResult:
        yield Meter("rows", id="meter-rows")
        yield Meter("tokens", id="meter-tokens")
        yield Meter("chunks", id="meter-chunks")

    def show(self, job: JobStatus) -> None:
        progress = job.progress or NO_PROGRESS
        rows = self.query_one("#meter-rows", Meter)
        label = "decodes" if is_acceptance_job(job) else "rows"  # eval-drafter counts decodes
        if rows.label != label:
            rows.label = label
            rows.refresh()
        rows.set_value(progress.rows_done, progress.rows_total)
        self.query_one("#meter-tokens", Meter).set_value(progress.tokens_done, progress.tokens_total)
        self.query_one("#meter-chunks", Meter).set_value(progress.chunks_done, progress.chunks_total)
        rejects = progress.rejects
        why = short_summary(progress.rejects_by_reason)
        set_border_subtitle(self, (f"rejects {rejects}" + (f": {why}" if why else "")) if rejects else "")

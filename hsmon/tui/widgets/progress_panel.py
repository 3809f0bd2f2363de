"""Progress bars: rows, tokens, chunks (and rejects beside them); a training's steps."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical

from hsmon.contracts.rejects import short_summary
from hsmon.status_doc import JobStatus, figures
from hsmon.tui.view import NO_PROGRESS, acceptance_result, acceptance_so_far, is_acceptance_job, sent
from hsmon.tui.widgets.meter import Meter
from hsmon.tui.widgets.quiet import set_border_subtitle


class ProgressPanel(Vertical):
    """Rows, tokens and chunks done against their totals; a training's steps against its total."""

    DEFAULT_CSS = "ProgressPanel { height: auto; }"

    def compose(self) -> ComposeResult:
        yield Meter("rows", id="meter-rows")
        yield Meter("tokens", id="meter-tokens")
        yield Meter("chunks", id="meter-chunks")

    def show(self, job: JobStatus) -> None:
        progress = job.progress or NO_PROGRESS
        rows = self.query_one("#meter-rows", Meter)
        acceptance = is_acceptance_job(job)
        training = job.training if figures.is_training(job.training) and not acceptance else None
        # eval-drafter counts decodes; a training counts steps (its rows and chunks never advance)
        label = "decodes" if acceptance else "steps" if training is not None else "rows"
        if rows.label != label:
            rows.label = label
            rows.refresh()
        if training is not None:
            rows.set_value(training.step, sent(training.total_steps))
        else:
            rows.set_value(progress.rows_done, progress.rows_total)
        for name in ("tokens", "chunks"):
            meter = self.query_one(f"#meter-{name}", Meter)
            # a regeneration writes a dataset, an evaluation decodes: neither has chunks
            shown = training is None and not (name == "chunks" and (job.kind == "regenerate" or acceptance))
            if meter.display != shown:
                meter.display = shown
        self.query_one("#meter-tokens", Meter).set_value(progress.tokens_done, progress.tokens_total)
        self.query_one("#meter-chunks", Meter).set_value(progress.chunks_done, progress.chunks_total)
        rejects = progress.rejects
        why = short_summary(progress.rejects_by_reason)
        subtitle = (f"rejects {rejects}" + (f": {why}" if why else "")) if rejects else ""
        so_far = acceptance_so_far(job) if acceptance and acceptance_result(job) is None else None
        set_border_subtitle(self, f"acceptance so far: {so_far}" if so_far else subtitle)

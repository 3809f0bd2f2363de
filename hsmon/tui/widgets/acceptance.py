"""`hsmon eval-drafter`'s acceptance lengths (drafter and n-gram, per depth), or its progress."""

from __future__ import annotations

from rich.text import Text

from hsmon.status_doc import JobStatus
from hsmon.tui.view import (
    NO_PROGRESS,
    acceptance_lines,
    acceptance_result,
    acceptance_so_far,
    fmt_count,
    progress_label,
)
from hsmon.tui.widgets.job_header import badge
from hsmon.tui.widgets.quiet import QuietStatic


class AcceptancePanel(QuietStatic):
    """Hidden until an acceptance measurement runs; then its progress, then its table."""

    DEFAULT_CSS = "AcceptancePanel { height: auto; margin-top: 1; }"

    def show(self, job: JobStatus | None) -> None:
        if self.display != (job is not None):
            self.display = job is not None
        if job is None:
            return
        result = acceptance_result(job)
        if result is not None:
            lines = acceptance_lines(result)
            text = Text(lines[0], style="bold")
            for line in lines[1:]:
                text.append(f"\n{line}")
        else:
            progress = job.progress or NO_PROGRESS
            text = Text.assemble(badge(job.state), " ", (job.job, "bold"),
                                 "\nmeasuring acceptance: decodes ",
                                 progress_label(progress.rows_done, progress.rows_total),
                                 f", {fmt_count(progress.tokens_done)} tokens decoded")
            so_far = acceptance_so_far(job)
            if so_far:
                text.append(f"\nacceptance so far: {so_far} (tokens per target forward)")
            if job.state in ("dead", "stalled") and job.reason:
                text.append(f"\n{job.reason}", style="italic")
        self.show_text(text)

"""`hsmon eval-drafter`'s acceptance lengths (drafter and n-gram, per depth), or its progress."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from hsmon.tui.view import acceptance_lines, acceptance_result, progress_label
from hsmon.tui.widgets.job_header import badge
from hsmon.tui.widgets.quiet import QuietStatic


class AcceptancePanel(QuietStatic):
    """Hidden until an acceptance measurement runs; then its progress, then its table."""

    DEFAULT_CSS = "AcceptancePanel { height: auto; margin-top: 1; }"

    def show(self, job: dict[str, Any] | None) -> None:
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
            progress = job.get("progress") or {}
            text = Text.assemble(badge(job.get("state")), " ", (str(job.get("job")), "bold"),
                                 "\nmeasuring acceptance: decodes ",
                                 progress_label(progress.get("rows_done"), progress.get("rows_total")))
            if job.get("state") in ("dead", "stalled") and job.get("reason"):
                text.append(f"\n{job['reason']}", style="italic")
        self.show_text(text)

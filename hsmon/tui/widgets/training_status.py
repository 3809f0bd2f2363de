"""A training job's figures: state, step, epoch, tokens/s, ETA, last checkpoint."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from hsmon.tui.view import fmt_rate
from hsmon.tui.widgets.job_header import badge
from hsmon.tui.widgets.quiet import QuietStatic
from hsmon.units import format_duration


class TrainingStatus(QuietStatic):
    """What the running (or last) training is doing."""

    def show(self, job: dict[str, Any] | None) -> None:
        if job is None:
            self.show_text(Text("no training job yet: fill in the form and press Launch (l)", style="dim"))
            return
        training = job.get("training") or {}
        text = Text.assemble(badge(job.get("state")), " ", (str(job.get("job")), "bold"))
        text.append(f"\nstep {training.get('step', '-')}  epoch {training.get('epoch', '-')}  "
                    f"{fmt_rate(training.get('tokens_per_s'), ' tok/s')}  "
                    f"ETA {format_duration(training.get('eta_s'))}")
        text.append(f"\ncheckpoint {training.get('last_checkpoint') or '-'}")
        if job.get("reason"):
            text.append(f"\n{job['reason']}", style="italic")
        self.show_text(text)

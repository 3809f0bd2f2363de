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
        total = training.get("total_steps")
        step = f"{training.get('step', '-')}" + (f" / {total}" if total else "")
        text.append(f"\nstep {step}  epoch {training.get('epoch', '-')}  "
                    f"{fmt_rate(training.get('tokens_per_s'), ' tok/s')}  "
                    f"ETA {format_duration(training.get('eta_s'))}")
        extras = [f"{name} {training[key]:.3g}" for key, name in
                  (("lr", "lr"), ("grad_norm", "grad norm"), ("data_wait_frac", "data wait"))
                  if isinstance(training.get(key), (int, float))]
        if extras:
            text.append("\n" + "  ".join(extras))
        text.append(f"\ncheckpoint {training.get('last_checkpoint') or '-'}")
        evaluation = training.get("eval")
        if isinstance(evaluation, dict) and evaluation:
            shown = {k: v for k, v in evaluation.items() if k not in ("v", "ts", "job", "kind")}
            text.append("\neval " + "  ".join(
                f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in list(shown.items())[:6]))
        if job.get("reason"):
            text.append(f"\n{job['reason']}", style="italic")
        self.show_text(text)

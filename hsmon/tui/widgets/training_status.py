"""A training job's figures: state, step, epoch, tokens/s, ETA, last checkpoint."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from hsmon.tui.view import eval_lines, fmt_num, fmt_pct_of, fmt_rate, job_elapsed_eta, job_eta_s, shorten_path
from hsmon.tui.widgets.job_header import badge
from hsmon.tui.widgets.quiet import QuietStatic


class TrainingStatus(QuietStatic):
    """What the running (or last) training is doing."""

    _job: dict[str, Any] | None = None

    def on_resize(self) -> None:
        self.show(self._job)  # paths are cut to the width

    def show(self, job: dict[str, Any] | None) -> None:
        self._job = job
        if job is None:
            self.show_text(Text("no training job yet: fill in the form and press Launch (l)", style="dim"))
            return
        training = job.get("training") or {}
        elapsed, eta = job_elapsed_eta(job)
        text = Text.assemble(badge(job.get("state")), " ", (str(job.get("job")), "bold"),
                             f"  elapsed {elapsed}")
        if job_eta_s(job) is not None:  # a finished training has no ETA
            text.append(f"  ETA {eta}")
        total = training.get("total_steps")
        step = f"{training.get('step', '-')}" + (f" / {total}" if total else "")
        text.append(f"\nstep {step}  epoch {training.get('epoch', '-')}  "
                    f"{fmt_rate(training.get('tokens_per_s'), ' tok/s')}")
        extras = [f"{name} {fmt(training[key])}" for key, name, fmt in
                  (("lr", "lr", lambda v: fmt_num(v, trim=True)), ("grad_norm", "grad norm", fmt_num),
                   ("data_wait_frac", "data wait", fmt_pct_of))
                  if isinstance(training.get(key), (int, float))]
        if extras:
            text.append("\n" + "  ".join(extras))
        checkpoint = training.get("last_checkpoint")
        width = max(20, (self.content_size.width or 60) - len("checkpoint "))
        text.append(f"\ncheckpoint {shorten_path(str(checkpoint), width) if checkpoint else '-'}")
        for line in eval_lines(training.get("eval")):
            text.append(f"\n{line}")
        if job.get("reason"):
            text.append(f"\n{job['reason']}", style="italic")
        self.show_text(text)

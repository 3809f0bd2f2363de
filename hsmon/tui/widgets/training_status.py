"""A training job's figures: state, step, epoch, tokens/s, ETA, last checkpoint."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from hsmon.status_doc import JobStatus, TrainingSection
from hsmon.tui.view import (
    eval_lines,
    find_start_event,
    fmt_num,
    fmt_pct_of,
    fmt_rate,
    job_elapsed_eta,
    job_eta_s,
    sent,
    shorten_path,
)
from hsmon.tui.widgets.job_header import badge
from hsmon.tui.widgets.quiet import QuietStatic


class TrainingStatus(QuietStatic):
    """What the running (or last) training is doing."""

    _job: JobStatus | None = None

    def on_resize(self) -> None:
        self.show(self._job)  # paths are cut to the width

    def show(self, job: JobStatus | None) -> None:
        self._job = job
        if job is None:
            self.show_text(Text("no training job yet: fill in the form and press Launch (l)", style="dim"))
            return
        training = job.training
        elapsed, eta = job_elapsed_eta(job)
        text = Text.assemble(badge(job.state), " ", (job.job, "bold"),
                             f"  elapsed {elapsed}")
        if job_eta_s(job) is not None:  # a finished training has no ETA
            text.append(f"  ETA {eta}")
        text.append("\n" + _step_line(training))
        arch = (find_start_event(job) or {}).get("arch")
        if arch:  # the drafter architecture, from the trainer's start event
            text.append(f"  {arch}")
        extras = [f"{name} {fmt(value)}" for value, name, fmt in
                  ((_figure(training, "lr"), "lr", lambda v: fmt_num(v, trim=True)),
                   (_figure(training, "grad_norm"), "grad norm", fmt_num),
                   (_figure(training, "data_wait_frac"), "data wait", fmt_pct_of))
                  if isinstance(value, (int, float))]
        if extras:
            text.append("\n" + "  ".join(extras))
        checkpoint = training.last_checkpoint if training is not None else None
        width = max(20, (self.content_size.width or 60) - len("checkpoint "))
        text.append(f"\ncheckpoint {shorten_path(str(checkpoint), width) if checkpoint else '-'}")
        for line in eval_lines(_figure(training, "eval")):
            text.append(f"\n{line}")
        if job.reason:
            text.append(f"\n{job.reason}", style="italic")
        if advice := _advice(job):  # "no speed-up yet: ...": the run learnt too little
            text.append(f"\n{advice}", style="bold yellow")
        self.show_text(text)


def _advice(job: JobStatus) -> str | None:
    """The trainer's "no speed-up yet" line from its `done` event (None when it learnt enough)."""
    done = next((e for e in reversed(job.recent_events) if e.get("kind") == "done"), None)
    advice = done.get("advice") if done else None
    return advice if isinstance(advice, str) and advice else None


def _figure(training: TrainingSection | None, name: str) -> Any:
    """A figure of the training section; None without the section or when the trainer did not send it."""
    return None if training is None else sent(getattr(training, name))


def _step_line(training: TrainingSection | None) -> str:
    """'step 120 / 1,000  epoch 0  3.1k tok/s' ('-' for what is unknown)."""
    if training is None:
        return f"step -  epoch -  {fmt_rate(None, ' tok/s')}"
    total = sent(training.total_steps)
    step = f"{training.step}" + (f" / {total}" if total else "")
    return f"step {step}  epoch {training.epoch}  {fmt_rate(training.tokens_per_s, ' tok/s')}"

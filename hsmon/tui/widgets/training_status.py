"""A training job's figures: state, step, epoch, tokens/s, ETA, loss and the other figures, last
checkpoint; or the trainer that follows an online extraction (`hsmon online`)."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from hsmon.status_doc import ENDED_STATES, JobStatus, TrainingSection, figures, online_of
from hsmon.status_doc.numbers import fmt_clock, fmt_count
from hsmon.tui.view import (
    eval_lines,
    find_start_event,
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
    _online: JobStatus | None = None

    def on_resize(self) -> None:
        self.show(self._job, self._online)  # paths are cut to the width

    def show(self, job: JobStatus | None, online: JobStatus | None = None) -> None:
        """``job``: the training to show; without one, ``online``: an online extraction whose
        trainer (the consumer side of its spool) is shown instead of an invitation to launch."""
        self._job, self._online = job, online
        if job is None and online is not None and online_of(online) is not None:
            self.show_text(online_trainer_text(online))
            return
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
        texts = figures.figure_texts(training)  # as `hsmon status` and the webhooks write them
        per_line = [t for t in texts if t.startswith(("loss ", "acc "))]
        rest = [t for t in texts if t not in per_line]
        for line in [*per_line, "  ".join(rest)] if rest else per_line:
            text.append("\n" + line)
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
    """'step 120 / 1,000, epoch 0, 3.10k tok/s' (`hsmon status` and the webhooks say the same)."""
    return figures.step_text(training)


def online_trainer_text(job: JobStatus) -> Text:
    """The trainer that follows an online extraction: its state, step and rate, from the job's
    online section, and that a training already follows the extraction."""
    online = online_of(job)
    assert online is not None
    side = online.consumer
    text = Text.assemble(badge(side.state), " ", ("trainer", "bold"), " following ", (job.job, "bold"))
    if side.pid:
        text.append(f"  PID {side.pid}")
    if side.eta_s is not None and side.state not in ENDED_STATES:
        text.append(f"  ETA {fmt_clock(side.eta_s)}")
    ended = side.state in ENDED_STATES
    text.append("\na training " + ("followed" if ended else "already follows") + " this extraction "
                "(hsmon train --follow): its figures are below, no second training is needed")
    parts = [f"step {fmt_count(online.trainer_step)}" if online.trainer_step is not None else "step -"]
    if online.trainer_arch:
        parts.append(online.trainer_arch)
    if side.rows_per_s is not None:
        parts.append(f"{side.rows_per_s:.2f} rows/s consumed")  # as the overview's online panel
    text.append("\n" + ", ".join(parts))
    for line in figures.figure_texts(online.training):  # as for any training
        text.append("\n" + line)
    passes = f", {online.passes} passes per row" if online.passes else ""
    text.append(f"\nspool: {fmt_count(online.rows_consumed)} of {fmt_count(online.rows_written)} rows "
                f"consumed, {fmt_count(online.rows_waiting)} waiting{passes}")
    if side.reason:
        text.append(f"\n{side.reason}", style="italic")
    if online.bottleneck:
        text.append(f"\n{online.bottleneck}", style="italic")
    return text

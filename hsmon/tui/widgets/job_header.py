"""The one line that says how a job is: coloured state badge, job, elapsed time, ETA, reason."""

from __future__ import annotations

from rich.text import Text

from hsmon.status_doc import ENDED_STATES, JobStatus, online_of
from hsmon.status_doc.numbers import clock_time, coarse_clocks
from hsmon.tui.view import job_elapsed_eta
from hsmon.tui.widgets.quiet import QuietStatic

BADGE_STYLES = {
    "starting": "bold black on cyan",
    "running": "bold black on green",
    "silent": "bold black on yellow",
    "stalled": "bold white on red",
    "dead": "bold white on dark_red",
    "paused": "bold black on magenta",
    "done": "bold white on blue",
    "stopped": "bold black on khaki1",  # ended on request before its work was done: not done
    "exited": "bold black on dark_orange",
    "quiet": "bold black on orange3",
    "unknown": "bold white on grey37",  # a tracker the verdict stands on is blind
}


def badge(state: str | None) -> Text:
    """The state as a coloured badge."""
    state = state or "unknown"
    return Text(f" {state.upper()} ", style=BADGE_STYLES.get(state, "bold white on grey37"))


def slower_side(job: JobStatus) -> str:
    """`` (training)`` when an online job's ETA is its trainer's (the slower side), else ``""``."""
    online = online_of(job)
    eta = job.progress.eta_s if job.progress is not None else None
    if online is None or eta is None or online.consumer.eta_s is None or eta != online.consumer.eta_s:
        return ""
    producer = online.producer.eta_s
    return " (training)" if producer is None or producer < eta else ""


class JobHeader(QuietStatic):
    """State badge, job name and kind, elapsed, ETA and the state's reason."""

    DEFAULT_CSS = "JobHeader { height: auto; }"
    DRAW_DIRECT = True

    def show(self, job: JobStatus, stale: str | None = None) -> None:
        elapsed, eta = job_elapsed_eta(job)
        # an ended job: when it ended (its own record: the done event, the manifest), not an ETA
        when = ("  ended ", (clock_time(job.state_since_ts), "bold")) if job.state in ENDED_STATES else (
            "  ETA ", (eta, "bold"), slower_side(job))
        text = Text.assemble(
            badge(job.state), " ",
            (job.job, "bold"), f" ({job.kind}{' + train' if online_of(job) is not None else ''})",
            "  elapsed ", (elapsed, "bold"), *when,
        )
        if job.reason:
            text.append(f"\n{coarse_clocks(job.reason)}", style="italic")
        if stale:
            text.append(f"\n{stale}", style="bold red")
        self.show_text(text)

"""Rates with sparklines over the job's whole run (hsmon/tui/series.py): rows/s, tokens/s, bytes/s
written; the clock times the sparklines span on the panel's bottom border, under them."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical

from hsmon.status_doc import JobStatus
from hsmon.status_doc.numbers import clock_time, fmt_clock
from hsmon.tui.series import fit
from hsmon.tui.view import (
    FINISHED_STATES,
    NO_PROGRESS,
    JobHistory,
    final_averages,
    fmt_byte_rate,
    fmt_rate,
    is_acceptance_job,
)
from hsmon.tui.widgets.quiet import QuietStatic, set_border_subtitle
from hsmon.tui.widgets.spark import QuietSparkline

RATES = (("rows", "rows/s"), ("tokens", "tok/s"), ("bytes", "written"))


class RateLabel(QuietStatic):
    """A rate as text, drawn straight into a strip (it changes every second)."""

    DRAW_DIRECT = True


class RatesPanel(Vertical):
    """The current rate beside a sparkline of its recent history; for a finished job, the averages
    over the whole run beside the history it had when it ended."""

    DEFAULT_CSS = """
    RatesPanel { height: auto; }
    RatesPanel > Horizontal { height: 1; }
    RatesPanel RateLabel { width: 22; }
    RatesPanel Sparkline { width: 1fr; }
    """

    _parts: dict[str, tuple[QuietStatic, QuietSparkline]] | None = None

    def compose(self) -> ComposeResult:
        for key, _ in RATES:
            with Horizontal():
                yield RateLabel("", id=f"rate-{key}")
                yield QuietSparkline([], id=f"spark-{key}")

    def show(self, job: JobStatus, history: JobHistory) -> None:
        progress = job.progress or NO_PROGRESS
        finished = job.state in FINISHED_STATES
        figures = final_averages(job) if finished else {
            "rows": progress.rows_per_s, "tokens": progress.tokens_per_s, "bytes": progress.bytes_per_s}
        values = {
            "rows": (fmt_rate(figures["rows"]), history.rows_per_s),
            "tokens": (fmt_rate(figures["tokens"]), history.tokens_per_s),
            "bytes": (fmt_byte_rate(figures["bytes"]), history.bytes_per_s),
        }
        span = history.rows_per_s.span
        axis = ""
        if span is not None and span[1] > span[0]:  # what the sparklines span, under them
            seconds = span[1] - span[0]
            axis = f"{clock_time(span[0], seconds)} → {clock_time(span[1], seconds)} ({fmt_clock(seconds)})"
        averages = "averages of the run" if finished else ""
        set_border_subtitle(self, " · ".join(t for t in (averages, axis) if t))
        if not self._parts:  # found once: this runs at every document
            self._parts = {key: (self.query_one(f"#rate-{key}", QuietStatic),
                                 self.query_one(f"#spark-{key}", QuietSparkline)) for key, _ in RATES}
        decodes = is_acceptance_job(job)  # eval-drafter: decodes and the tokens they decoded
        for key, unit in RATES:
            unit = "decode/s" if decodes and key == "rows" else unit
            text, series = values[key]
            text = f"avg {text}" if finished else text
            label, spark = self._parts[key]
            label.show_text(f"{unit:<8}{text:>13}")
            spark.data = fit(list(series), spark.size.width or 60)  # the whole run, the newest last

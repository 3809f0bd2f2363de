"""Rates with sparklines: rows/s, tokens/s, bytes/s written."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Sparkline

from hsmon.tui.view import JobHistory, fmt_byte_rate, fmt_rate
from hsmon.tui.widgets.quiet import QuietStatic

RATES = (("rows", "rows/s"), ("tokens", "tok/s"), ("bytes", "written"))


class RatesPanel(Vertical):
    """The current rate beside a sparkline of its recent history."""

    DEFAULT_CSS = """
    RatesPanel { height: auto; }
    RatesPanel > Horizontal { height: 1; }
    RatesPanel QuietStatic { width: 20; }
    RatesPanel Sparkline { width: 1fr; }
    """

    def compose(self) -> ComposeResult:
        for key, _ in RATES:
            with Horizontal():
                yield QuietStatic("", id=f"rate-{key}")
                yield Sparkline([], id=f"spark-{key}")

    def show(self, job: dict[str, Any], history: JobHistory) -> None:
        progress = job.get("progress") or {}
        values = {
            "rows": (fmt_rate(progress.get("rows_per_s")), history.rows_per_s),
            "tokens": (fmt_rate(progress.get("tokens_per_s")), history.tokens_per_s),
            "bytes": (fmt_byte_rate(progress.get("bytes_per_s")), history.bytes_per_s),
        }
        for key, unit in RATES:
            text, series = values[key]
            self.query_one(f"#rate-{key}", QuietStatic).show_text(f"{unit:<8}{text:>11}")
            self.query_one(f"#spark-{key}", Sparkline).data = list(series)

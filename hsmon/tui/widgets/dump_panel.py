"""The dump directory's backlog: files, bytes, oldest age, created/consumed rates, a sparkline."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical

from hsmon.contracts.units import format_bytes
from hsmon.status_doc import JobStatus
from hsmon.status_doc.numbers import counted
from hsmon.tui.series import fit
from hsmon.tui.view import JobHistory, fmt_clock, fmt_rate, shorten_path
from hsmon.tui.widgets.quiet import QuietStatic, set_border_title, set_display
from hsmon.tui.widgets.spark import QuietSparkline


class DumpPanel(Vertical):
    """Backlog of the RAM dump directory: a growing backlog means the consumer fell behind."""

    DEFAULT_CSS = """
    DumpPanel { height: auto; }
    DumpPanel Sparkline { height: 1; }
    """

    def compose(self) -> ComposeResult:
        yield QuietStatic("", id="dump-figures")
        yield QuietSparkline([], id="dump-spark")

    def show(self, job: JobStatus, history: JobHistory) -> None:
        dump = job.dump
        set_display(self, dump is not None)
        if dump is None:
            return
        path = shorten_path(dump.path, max(12, self.size.width - 9))
        set_border_title(self, f"dump {path}")
        if dump.error:
            self.query_one("#dump-figures", QuietStatic).show_text(f"cannot read: {dump.error}")
        elif not dump.exists:
            self.query_one("#dump-figures", QuietStatic).show_text("directory does not exist (yet)")
        else:
            self.query_one("#dump-figures", QuietStatic).show_text(
                f"{counted(dump.files, 'file')}  {format_bytes(dump.bytes)}  "
                f"oldest {fmt_clock(dump.oldest_age_s)}  "
                f"in {fmt_rate(dump.created_per_s)} out {fmt_rate(dump.consumed_per_s)}")
        spark = self.query_one("#dump-spark", QuietSparkline)
        spark.data = fit(list(history.dump_files), spark.size.width or 60)  # the whole run, the newest last

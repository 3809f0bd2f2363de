"""The data being written: per layer a norm sparkline over chunks and its NaN/Inf rows, and the last
engine-verify verdict (lines from hsmon/tui/data_view.py)."""

from __future__ import annotations

from hsmon.status_doc import DataSection, JobStatus
from hsmon.tui.data_view import data_alarm, data_section, data_text
from hsmon.tui.widgets.quiet import QuietStatic, set_display


class DataPanel(QuietStatic):
    """Hidden when the output has no data facts (not the hsmon layout); red-bordered on NaN/Inf rows
    or an engine disagreement. Repainted only when its text changed (a chunk completed)."""

    _data: DataSection | None = None

    def show(self, job: JobStatus) -> None:
        self._data = data_section(job)
        set_display(self, self._data is not None)
        if self._data is None:
            return
        self.set_class(data_alarm(self._data), "-alarm")
        self.show_text(data_text(self._data, self.content_size.width or 60))

    def on_resize(self) -> None:
        if self._data is not None:
            self.show_text(data_text(self._data, self.content_size.width or 60))

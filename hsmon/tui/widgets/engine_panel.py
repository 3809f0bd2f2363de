"""The engine: a state badge, load and sparklines per inference server, a utilization bar per GPU."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widget import Widget

from hsmon.status_doc import GpuSection, JobStatus
from hsmon.tui.engine_view import gpu_lines, has_engine, server_lines
from hsmon.tui.view import JobHistory
from hsmon.tui.widgets.quiet import set_display


class EnginePanel(Widget):
    """Hidden when the job has no server and NVML reports no GPU (this panel is then all noise).
    Repainted only when its lines changed, re-laid out only when their number changed."""

    DEFAULT_CSS = "EnginePanel { height: auto; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.history = JobHistory()
        self._job: JobStatus | None = None
        self._gpus: GpuSection | None = None
        self._text: Text | None = None

    def show(
        self, job: JobStatus, history: JobHistory, gpus: GpuSection | None, now_ts: float | None
    ) -> None:
        self.history = history
        visible = has_engine(job, gpus)
        set_display(self, visible)
        self._job, self._gpus = job, gpus
        if visible:
            self._redraw()

    def on_resize(self) -> None:
        if self._job is not None:  # a pane mounted by a layout pass before its first document
            self._redraw()

    def _lines(self) -> Text:
        width = max(20, self.content_size.width or self.size.width)
        lines = server_lines(self._job, self.history, width)
        shown = self._gpus is not None and (self._gpus.available or bool(lines))
        lines += gpu_lines(self._gpus if shown else None, width)
        return Text("\n").join(lines) if lines else Text("")

    def _redraw(self) -> None:
        text = self._lines()
        if text == self._text:
            return
        layout = self._text is None or self._text.plain.count("\n") != text.plain.count("\n")
        self._text = text
        self.refresh(layout=layout)

    def render(self) -> Text:
        if self._text is None and self._job is None:
            return Text("")
        return self._text if self._text is not None else self._lines()

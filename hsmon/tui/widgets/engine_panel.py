"""The engine: a state badge, load and sparklines per inference server, a utilization bar per GPU."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widget import Widget

from hsmon.tui.engine_view import gpu_lines, has_engine, server_lines
from hsmon.tui.view import JobHistory


class EnginePanel(Widget):
    """Hidden when the job has no server and NVML reports no GPU (this panel is then all noise)."""

    DEFAULT_CSS = "EnginePanel { height: auto; }"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.history = JobHistory()
        self._job: dict[str, Any] = {}
        self._gpus: dict[str, Any] | None = None
        self._shown: tuple[Any, ...] | None = None

    def show(
        self, job: dict[str, Any], history: JobHistory, gpus: dict[str, Any] | None, now_ts: float | None
    ) -> None:
        self.history = history
        visible = has_engine(job, gpus)
        if self.display != visible:
            self.display = visible
        self._job, self._gpus = job, gpus
        shape = (now_ts, len(job.get("servers") or []), len((gpus or {}).get("devices") or []))
        if visible and shape != self._shown:
            self._shown = shape
            self.refresh(layout=True)

    def render(self) -> Text:
        width = max(20, self.content_size.width or self.size.width)
        lines = server_lines(self._job, self.history, width)
        lines += gpu_lines(self._gpus if (self._gpus or {}).get("available") or lines else None, width)
        return Text("\n").join(lines) if lines else Text("")

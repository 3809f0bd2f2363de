"""Disk headroom: free against still needed, fits or not, time to full against time to done."""

from __future__ import annotations

from rich.text import Text

from hsmon.status_doc import ENDED_STATES, JobStatus
from hsmon.tui.view import disk_alarming, disk_lines, shorten_path
from hsmon.tui.widgets.quiet import QuietStatic

VERDICT_STYLES = {"fits": "green", "WILL NOT FIT": "bold red", "fills before done": "bold yellow"}
ROLE_WIDTH = 7


class DiskPanel(QuietStatic):
    """Two lines per filesystem the job writes to (the output and /dev/shm); a long path is cut in
    its middle to the panel's width, so its last directory stays visible."""

    DEFAULT_CSS = "DiskPanel { text-wrap: nowrap; text-overflow: ellipsis; }"

    _job: JobStatus | None = None

    def show(self, job: JobStatus) -> None:
        self._job = job
        lines = disk_lines(job.disk)
        if self.display != bool(lines):
            self.display = bool(lines)
        self.set_class(any(disk_alarming(line) for line in lines), "-alarm")
        width = self.content_size.width or 60
        text = Text()
        projected = job.state not in ENDED_STATES  # an ended job writes no more: no time to full
        for i, line in enumerate(lines):
            if i:
                text.append("\n")
            text.append(f"{line.role:<{ROLE_WIDTH}}", style="bold")
            text.append(f"{line.free} free, needs {line.needed}: ")
            text.append(line.verdict, style=VERDICT_STYLES.get(line.verdict, "dim"))
            times = f"{'':<{ROLE_WIDTH}}" + (
                f"full in {line.time_to_full}, done in {line.time_to_done}  "
                if line.projected and projected else "")
            path = shorten_path(line.path, max(12, width - len(times)))
            if len(times) + len(path) > width:  # narrow: the path on a line of its own
                times = times.rstrip() + f"\n{'':<{ROLE_WIDTH}}"
                path = shorten_path(line.path, max(8, width - ROLE_WIDTH))
            text.append(f"\n{times}{path}", style="dim")
        text.no_wrap = True
        text.overflow = "ellipsis"
        self.show_text(text)

    def on_resize(self) -> None:
        if self._job is not None:
            self.show(self._job)

"""Disk headroom: free against still needed, fits or not, time to full against time to done."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from hsmon.tui.view import disk_alarming, disk_lines
from hsmon.tui.widgets.quiet import QuietStatic

VERDICT_STYLES = {"fits": "green", "WILL NOT FIT": "bold red", "fills before done": "bold yellow"}


class DiskPanel(QuietStatic):
    """Two lines per filesystem the job writes to (the output and /dev/shm)."""

    DEFAULT_CSS = "DiskPanel { text-wrap: nowrap; text-overflow: ellipsis; }"

    def show(self, job: dict[str, Any]) -> None:
        lines = disk_lines(job.get("disk"))
        if self.display != bool(lines):
            self.display = bool(lines)
        self.set_class(any(disk_alarming(line) for line in lines), "-alarm")
        text = Text()
        for i, line in enumerate(lines):
            if i:
                text.append("\n")
            text.append(f"{line.role:<7}", style="bold")
            text.append(f"{line.free} free, needs {line.needed}: ")
            text.append(line.verdict, style=VERDICT_STYLES.get(line.verdict, "dim"))
            text.append(f"\n{'':<7}full in {line.time_to_full}, done in {line.time_to_done}  {line.path}",
                        style="dim")
        text.no_wrap = True
        text.overflow = "ellipsis"
        self.show_text(text)

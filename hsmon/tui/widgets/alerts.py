"""Hints and alerts, shown prominently above everything else (hidden when there are none)."""

from __future__ import annotations

from rich.text import Text

from hsmon.status_doc import JobStatus
from hsmon.tui.view import alerts
from hsmon.tui.widgets.quiet import QuietStatic

SEVERITY_STYLES = {"critical": "bold red", "warning": "bold yellow", "info": "cyan"}
SEVERITY_MARKS = {"critical": "✖", "warning": "▲", "info": "ℹ"}


class AlertsPanel(QuietStatic):
    """Every hint of the job (e.g. the stdout-buffering hint) and every disk or state alarm."""

    def show(self, job: JobStatus) -> None:
        items = alerts(job)
        if self.display != bool(items):
            self.display = bool(items)
        self.set_class(any(sev == "critical" for sev, _ in items), "-critical")
        text = Text()
        for i, (severity, message) in enumerate(items):
            if i:
                text.append("\n")
            style = SEVERITY_STYLES.get(severity, "")
            text.append(f"{SEVERITY_MARKS.get(severity, '•')} {message}", style=style)
        self.show_text(text)

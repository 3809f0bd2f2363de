"""The job's processes: role, PID, state, CPU %, RSS, uptime, restarts."""

from __future__ import annotations

from typing import Any

from textual.widgets import DataTable

from hsmon.tui.view import process_rows

MAX_HEIGHT = 9
COLUMNS = ("role", "PID", "state", "CPU", "RSS", "uptime", "restarts")


class ProcessTable(DataTable):
    """Rebuilt only when a figure changed, so an idle job costs nothing."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self._rows: list[tuple[str, ...]] = []

    def on_mount(self) -> None:
        self.add_columns(*COLUMNS)

    def show(self, job: dict[str, Any]) -> None:
        rows = process_rows(job.get("processes"))
        if rows == self._rows:
            return
        self._rows = rows
        # Columns too: their widths then fit the rows shown now, not the widest ever shown (a
        # process that was alive with figures and is now gone shows as the same table either way).
        self.clear(columns=True)
        self.add_columns(*COLUMNS)
        if rows:
            self.add_rows(rows)
        else:
            self.add_row("-", "-", "no process found", "", "", "", "")
        # Auto height is measured once, while the table is empty: size it to its rows (header, border).
        self.styles.height = min(max(len(rows), 1) + 3, MAX_HEIGHT)

"""The job's processes: role, PID, state, CPU %, RSS, uptime, restarts."""

from __future__ import annotations

from typing import Any

from rich.cells import cell_len
from textual.widgets import DataTable

from hsmon.tui.view import process_rows

MAX_HEIGHT = 9
COLUMNS = ("role", "PID", "state", "CPU", "RSS", "uptime", "restarts")
NO_PROCESS = ("-", "-", "no process found", "", "", "", "")


def column_widths(rows: list[tuple[str, ...]]) -> tuple[int, ...]:
    """The width each column takes for these rows (its header or its widest cell)."""
    return tuple(max([cell_len(name)] + [cell_len(row[i]) for row in rows]) for i, name in enumerate(COLUMNS))


class ProcessTable(DataTable):
    """Changed cells are updated in place (a ticking uptime repaints one cell); the table is rebuilt
    only when its rows or its column widths change."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self._rows: list[tuple[str, ...]] | None = None
        self._widths: tuple[int, ...] = ()

    def on_mount(self) -> None:
        self.add_columns(*COLUMNS)

    def show(self, job: dict[str, Any]) -> None:
        rows = process_rows(job.get("processes")) or [NO_PROCESS]
        if rows == self._rows:
            return
        widths = column_widths(rows)
        if self._rows is not None and len(rows) == len(self._rows) and widths == self._widths:
            for y, (old, new) in enumerate(zip(self._rows, rows, strict=True)):
                for x, (before, after) in enumerate(zip(old, new, strict=True)):
                    if before != after:
                        self.update_cell_at((y, x), after)
            self._rows = rows
            return
        self._rows, self._widths = rows, widths
        # Columns too: their widths then fit the rows shown now, not the widest ever shown (a
        # process that was alive with figures and is now gone shows as the same table either way).
        self.clear(columns=True)
        self.add_columns(*COLUMNS)
        self.add_rows(rows)
        # Auto height is measured once, while the table is empty: size it to its rows (header, border).
        self.styles.height = min(len(rows) + 3, MAX_HEIGHT)

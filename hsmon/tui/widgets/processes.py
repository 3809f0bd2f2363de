"""The job's processes: role, PID, state, CPU %, RSS, uptime, restarts."""

from __future__ import annotations

from typing import Any, ClassVar

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from hsmon.status_doc import JobStatus
from hsmon.tui.view import process_rows, stale_sections

MAX_HEIGHT = 9  # rows shown at most, with the header and the border; more scroll
COLUMNS = ("role", "PID", "state", "CPU", "RSS", "uptime", "restarts")
NO_PROCESS = ("-", "-", "no process found", "", "", "", "")


def column_widths(rows: list[tuple[str, ...]]) -> tuple[int, ...]:
    """The width each column takes for these rows (its header or its widest cell)."""
    return tuple(max([cell_len(name)] + [cell_len(row[i]) for row in rows]) for i, name in enumerate(COLUMNS))


def table_line(cells: tuple[str, ...], widths: tuple[int, ...]) -> str:
    """One line of the table: each cell padded to its column, a space either side."""
    return "".join(f" {cell}{' ' * (width - cell_len(cell))} "
                   for cell, width in zip(cells, widths, strict=True))


class ProcessTable(ScrollView):
    """A header and a line per process, drawn line by line: a document that changes one figure (a
    ticking CPU %) repaints that line alone, and the table is laid out again only when its number
    of rows changes. The columns fit the rows shown now, not the widest ever shown."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"processes--header"}
    DEFAULT_CSS = """
    ProcessTable { height: auto; scrollbar-size-horizontal: 0; }
    ProcessTable > .processes--header { text-style: bold; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._rows: list[tuple[str, ...]] = []
        self._widths: tuple[int, ...] = column_widths([])
        self._lines: list[str] = [table_line(COLUMNS, self._widths)]
        self._header_style: Style | None = None

    @property
    def rows(self) -> list[tuple[str, ...]]:
        """The rows shown (the cells as text)."""
        return list(self._rows)

    @property
    def widths(self) -> tuple[int, ...]:
        """Each column's width as shown."""
        return self._widths

    def show(self, job: JobStatus) -> None:
        rows = process_rows(job.processes, stale="processes" in stale_sections(job)) or [NO_PROCESS]
        if rows == self._rows:
            return
        widths = column_widths(rows)
        lines = [table_line(COLUMNS, widths)] + [table_line(row, widths) for row in rows]
        if len(lines) != len(self._lines):
            self.virtual_size = Size(0, len(lines))
            self.styles.height = min(len(lines) + 2, MAX_HEIGHT)
            self.refresh()
        elif widths != self._widths:
            self.refresh()
        else:  # the same shape: only the lines that changed (in content coordinates)
            width = self.scrollable_content_region.width
            for y, (before, after) in enumerate(zip(self._lines, lines, strict=True)):
                if before != after and y:
                    self.refresh(Region(0, y - self.scroll_offset.y, width, 1))
        self._rows, self._widths, self._lines = rows, widths, lines

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        base = self.rich_style
        index = y if y == 0 else y + self.scroll_offset.y
        if index >= len(self._lines):
            return Strip.blank(width, base)
        text = self._lines[index]
        if cell_len(text) > width:
            text = set_cell_size(text, width)
        if index == 0:
            segment = Segment(text, self.get_component_rich_style("processes--header", partial=True))
        else:
            segment = Segment(text)
        return Strip([segment], cell_len(text)).extend_cell_length(width, base).apply_style(base)

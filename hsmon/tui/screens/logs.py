"""`l` on the overview: the selected job's log, tailed as `tail -f` does (the logs the status
document names: ``jobs[].logs``, typed ``LogFile``s: the training's train.log, the extraction's
output, a `hsmon run` command's log).

The file is read from where the last read ended, once a second while this screen is shown (a log
rotated or truncated is read again from its start); the newest ``KEEP_LINES`` lines are kept, so
the screen's memory and its cost per second stay flat however large the log grows. `/` keeps the
lines that hold a text, `f` stops or resumes following the end, `n` shows the job's next log.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Header, Input, Log, Static

from hsmon.status_doc import LogFile
from hsmon.tui.widgets.compact_footer import compact_footer

KEEP_LINES = 5000
FIRST_READ_BYTES = 256 * 1024  # the tail read when the screen opens
LINE_CHARS = 2000  # a longer line is cut: a log line, not a data dump


@dataclass
class Tail:
    """Where a log was read up to: the file's identity and the offset after its last whole line."""

    path: str
    inode: int | None = None
    offset: int = 0
    partial: bytes = b""

    def read(self) -> tuple[list[str], bool]:
        """The lines added since the last read, and whether the file was read from its start again
        (rotated or truncated). Nothing (and no error) while the file does not exist."""
        try:
            with open(self.path, "rb") as fh:
                stat = os.fstat(fh.fileno())
                again = self.inode is not None and (stat.st_ino != self.inode or stat.st_size < self.offset)
                if self.inode is None or again:
                    self.inode, self.partial = stat.st_ino, b""
                    self.offset = 0 if again else max(0, stat.st_size - FIRST_READ_BYTES)
                fh.seek(self.offset)
                data = fh.read(max(0, stat.st_size - self.offset))
        except OSError:
            return [], False
        self.offset += len(data)
        data = self.partial + data
        *whole, self.partial = data.split(b"\n")
        return [line.decode("utf-8", "replace")[:LINE_CHARS] for line in whole], again


class LogScreen(Screen[None]):
    """A job's log, followed; escape goes back to the overview."""

    BINDINGS: ClassVar = [
        Binding("escape,q", "back", "back"),
        Binding("f", "follow", "follow"),
        Binding("slash", "search", "search", key_display="/"),
        Binding("n", "next_log", "next log"),
    ]

    def __init__(self, job: str, logs: list[LogFile], local: bool) -> None:
        super().__init__()
        self.job, self.logs, self.local = job, logs, local
        self.index = 0
        self.lines: deque[str] = deque(maxlen=KEEP_LINES)
        self.tail: Tail | None = None
        self.following = True
        self.search = ""

    def compose(self) -> ComposeResult:
        yield Header(icon="◉")
        yield Static("", id="log-title")
        yield Input(placeholder="search the log (enter keeps it, escape clears)", id="log-search")
        yield Log(max_lines=KEEP_LINES, auto_scroll=True, id="log-lines")
        yield compact_footer()

    def on_mount(self) -> None:
        self.query_one("#log-search", Input).display = False
        self._open()
        self.set_interval(1.0, self._poll)

    def _open(self) -> None:
        self.lines.clear()
        self.query_one(Log).clear()
        if not self.logs:
            self._title(f"no log known for {self.job}: it names none in its start event and its processes' "
                        "output is not a file (a terminal or a pipe)")
            self.tail = None
            return
        log = self.logs[self.index]
        if not self.local:
            self._title(f"{log.what}: {log.path} is on the daemon's machine: read it there "
                        f"(tail -f {log.path})")
            self.tail = None
            return
        self.tail = Tail(log.path)
        self._poll()

    def _title(self, text: str) -> None:
        self.query_one("#log-title", Static).update(text)

    def _describe(self) -> None:
        log = self.logs[self.index]
        more = f"  ({self.index + 1} of {len(self.logs)}: n for the next)" if len(self.logs) > 1 else ""
        state = "following" if self.following else "paused (f follows)"
        found = f"  /{self.search}: {self._shown} lines" if self.search else ""
        kept = f"{len(self.lines)} lines kept"
        self._title(f"{self.job}: {log.what}: {log.path}  [{state}, {kept}]{found}{more}")

    _shown = 0

    def _poll(self) -> None:
        if self.tail is None:
            return
        new, again = self.tail.read()
        if again:
            self.lines.clear()
            self.query_one(Log).clear()
            self._shown = 0
        self.lines.extend(new)
        shown = [line for line in new if self._matches(line)]
        self._shown += len(shown)
        if shown:
            self.query_one(Log).write_lines(shown, scroll_end=self.following)
        self._describe()

    def _matches(self, line: str) -> bool:
        return not self.search or self.search.casefold() in line.casefold()

    def _refilter(self) -> None:
        shown = [line for line in self.lines if self._matches(line)]
        self._shown = len(shown)
        log = self.query_one(Log)
        log.clear()
        log.write_lines(shown, scroll_end=True)
        self._describe()

    def action_back(self) -> None:
        """Escape in the search field clears the search; anywhere else, back to the overview."""
        field = self.query_one("#log-search", Input)
        if field.has_focus:
            field.value = ""
            field.display = False
            self.query_one(Log).focus()
        else:
            self.app.pop_screen()

    def action_follow(self) -> None:
        self.following = not self.following
        log = self.query_one(Log)
        log.auto_scroll = self.following
        if self.following:
            log.scroll_end(animate=False)
        if self.tail is not None:
            self._describe()

    def action_next_log(self) -> None:
        if len(self.logs) > 1:
            self.index = (self.index + 1) % len(self.logs)
            self._open()

    def action_search(self) -> None:
        field = self.query_one("#log-search", Input)
        field.display = True
        field.focus()

    def on_input_changed(self, message: Input.Changed) -> None:
        if message.value.startswith("/"):  # the key that opened the field reaches it too
            message.input.value = message.value[1:]
            return
        self.search = message.value
        if self.tail is not None:
            self._refilter()

    def on_input_submitted(self, message: Input.Submitted) -> None:
        self.query_one(Log).focus()

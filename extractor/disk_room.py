"""Room on the output's filesystem, for every writer of the extractor (`hsmon extract`'s chunks and
manifest, `hsmon regenerate`'s dataset and manifest): a write waits, paused (reason ``disk``), while
it would leave less free than ``--min-free``, and resumes by itself once room is back; a stop
requested meanwhile abandons it (`Abandoned`). A write that still meets a full disk (ENOSPC, EDQUOT)
waits for more room and is tried again."""

from __future__ import annotations

import errno
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hsmon.contracts.pauses import Pause
from hsmon.contracts.units import format_bytes

# Room kept for manifest growth and filesystem rounding on top of a file's own size.
WRITE_MARGIN_BYTES = 64 * 1024


class Abandoned(Exception):
    """A stop was requested while the writer waited for disk space (or spool room)."""


class DiskRoom:
    """Waits for room on ``directory``'s filesystem before each write (see the module's docstring)."""

    def __init__(self, directory: Path, min_free: int, poll_seconds: float, events: Any, progress: Any,
                 stop_event: threading.Event) -> None:
        self.directory, self.min_free, self.poll_seconds = directory, min_free, poll_seconds
        self.stop_event = stop_event
        self.pause = Pause("disk", events, progress)

    def write(self, size: int, write: Callable[[], Any]) -> None:
        """Wait for room (reserve included), write; on ENOSPC anyway, wait for more room and retry."""
        need = size + WRITE_MARGIN_BYTES
        while True:
            self.wait(need)
            try:
                write()
                return
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                need += max(size, 1 << 20)  # the estimate was short: ask for more before retrying

    def wait(self, need: int) -> None:
        """Return once ``need`` bytes fit above the reserve; Abandoned on a stop meanwhile."""
        while True:
            free = shutil.disk_usage(self.directory).free
            if free - need >= self.min_free:
                self.pause.end(f"{format_bytes(free)} free on {self.directory}", free_bytes=free)
                return
            self.pause.begin(
                f"{format_bytes(free)} free on {self.directory}, the next write needs {format_bytes(need)} "
                f"above the --min-free reserve of {format_bytes(self.min_free)}",
                f"{format_bytes(need + self.min_free - free)} more free space (stop with SIGTERM)",
                self.poll_seconds, free_bytes=free, need_bytes=need, min_free_bytes=self.min_free,
                path=str(self.directory))
            if self.stop_event.is_set():
                raise Abandoned
            time.sleep(self.poll_seconds)

"""The client's side of the dump directory (``--transport shm``): backpressure before each new
request, orphaned files from an earlier run reused or removed, and a clean directory at the end.

Dump files are named ``<rid>.safetensors`` with ``rid = r<row>-<run nonce>-<attempt>``, so a
resumed run knows which row an orphan holds; the plugin writes ``.<rid>.safetensors.tmp`` first
(a server killed mid-write leaves only that, removed here) and ``<rid>.error`` when it fails.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Any

from extractor.backends.sglang.pool import Stopped
from hsmon.contracts.pauses import Pause
from hsmon.contracts.units import format_bytes

DUMP_SUFFIX = ".safetensors"
ERROR_SUFFIX = ".error"  # the plugin's writer could not write the file: never an orphan, removed
PROBE_PREFIX = "probe-"  # control requests' rids (see backend._evidence): never a row's file
_RID = re.compile(r"^r(\d+)-[0-9a-f]+-\d+$")


def row_of(name: str) -> int | None:
    """The row a dump file (or rid) belongs to, None for other files."""
    rid = name.removesuffix(DUMP_SUFFIX).removesuffix(ERROR_SUFFIX)
    match = _RID.match(rid)
    return int(match.group(1)) if match else None


def dir_bytes(path: Path) -> int:
    total = 0
    with contextlib.suppress(FileNotFoundError), os.scandir(path) as entries:
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):
                if entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
    return total


def _why_text(path: Path, why: dict[str, Any]) -> str:
    if why["limit"] == "max_dump_bytes":
        return (f"the dump directory {path} holds {format_bytes(why['dump_bytes'])}, over --max-dump-bytes "
                f"{format_bytes(why['max_dump_bytes'])}")
    return (f"{format_bytes(why['free_bytes'])} free on the filesystem of {path}, under its reserve of "
            f"{format_bytes(why['min_free_bytes'])}")


class DumpDir:
    """Backpressure and orphan handling for one run's dump directory."""

    def __init__(self, path: Path, max_bytes: int, min_free: int, events: Any, progress: Any,
                 stop_event: threading.Event, poll_s: float = 0.2) -> None:
        self.path = path
        self.max_bytes, self.min_free, self.poll_s = max_bytes, min_free, poll_s
        self.events, self.progress, self.stop_event = events, progress, stop_event
        self._lock = threading.Lock()
        self._pause = Pause("shm", events, progress)
        self.orphans: dict[int, Path] = {}

    def prepare(self) -> None:
        """Create the directory; remember complete-looking orphans by row, remove temporaries."""
        self.path.mkdir(parents=True, exist_ok=True)
        for entry in self.path.iterdir():
            row = row_of(entry.name)
            if entry.name.endswith(DUMP_SUFFIX) and row is not None and row not in self.orphans:
                self.orphans[row] = entry
            elif entry.is_file() and (entry.name.endswith(".tmp") or row is not None
                                      or entry.name.startswith(PROBE_PREFIX)):
                entry.unlink(missing_ok=True)

    def take_orphan(self, row: int) -> Path | None:
        with self._lock:
            return self.orphans.pop(row, None)

    def _why_full(self) -> dict[str, Any] | None:
        used = dir_bytes(self.path)
        if used > self.max_bytes:
            return {"limit": "max_dump_bytes", "dump_bytes": used, "max_dump_bytes": self.max_bytes}
        free = shutil.disk_usage(self.path).free
        if free < self.min_free:
            return {"limit": "shm_free", "free_bytes": free, "min_free_bytes": self.min_free}
        return None

    def wait_for_room(self) -> None:
        """Block new requests while the dump dir is over ``--max-dump-bytes`` or its filesystem's
        free space is under the reserve; ``pause``/``resume`` events with reason ``shm``."""
        while True:
            why = self._why_full()
            if why is None:
                self._pause.end(f"room again in {self.path}", path=str(self.path))
                return
            self._pause.begin(_why_text(self.path, why),
                              "the server's dump files to be consumed (stop with SIGTERM)", self.poll_s,
                              path=str(self.path), **why)
            if self.stop_event.wait(self.poll_s):
                raise Stopped

    def clean(self) -> None:
        """Remove what this run left (orphans not reused, late files); the directory too if empty."""
        self.orphans.clear()
        with contextlib.suppress(FileNotFoundError):
            for entry in self.path.iterdir():
                if entry.is_file() and (row_of(entry.name) is not None or entry.name.endswith(".tmp")
                                        or entry.name.startswith(PROBE_PREFIX)):
                    entry.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.path.rmdir()

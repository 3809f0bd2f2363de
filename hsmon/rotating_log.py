"""An append-only log file with size-based rotation that never loses the tail.

Rotation renames (``LOG`` -> ``LOG.1`` -> ``LOG.2`` ...) and opens a new ``LOG``: nothing is
truncated or copied, so the newest bytes are always in ``LOG`` (and the ones before in ``LOG.1``),
and a reader that holds the old file open still reads it to its end. Rotation happens at a line
boundary; a single line longer than the limit is still written whole.
"""

from __future__ import annotations

import os
import threading


class RotatingLog:
    """Writes bytes as they come (flushed at once) to ``path``, rotating past ``max_bytes``."""

    def __init__(self, path: str, max_bytes: int = 64 * 1024 * 1024, backups: int = 3) -> None:
        if max_bytes <= 0 or backups < 1:
            raise ValueError("max_bytes must be positive and backups at least 1")
        self.path, self.max_bytes, self.backups = path, max_bytes, backups
        self._lock = threading.Lock()
        self._fh = open(path, "ab", buffering=0)  # noqa: SIM115
        self._size = os.fstat(self._fh.fileno()).st_size
        self.bytes_total = 0  # written by this writer, across rotations
        self.lines_total = 0
        self.rotations = 0

    def write(self, data: bytes) -> None:
        """Append ``data`` now; rotate first at its last newline if the file would pass the limit."""
        if not data:
            return
        with self._lock:
            self.bytes_total += len(data)
            self.lines_total += data.count(b"\n")
            if self._size + len(data) > self.max_bytes:
                cut = data.rfind(b"\n") + 1
                if cut == 0 and self._size == 0:
                    cut = len(data)  # one line longer than the limit, alone in a fresh file
                if cut:
                    self._write(data[:cut])
                    data = data[cut:]
                    self._rotate()
                elif self._size > self.max_bytes:
                    self._rotate()
            self._write(data)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = self._fh.write(view)
            view = view[n:]
        self._size += len(data)

    def _rotate(self) -> None:
        self._fh.close()
        for i in range(self.backups - 1, 0, -1):
            src = f"{self.path}.{i}"
            if os.path.exists(src):
                os.replace(src, f"{self.path}.{i + 1}")
        os.replace(self.path, f"{self.path}.1")
        self._fh = open(self.path, "ab", buffering=0)  # noqa: SIM115
        self._size = 0
        self.rotations += 1

    def close(self) -> None:
        with self._lock:
            self._fh.close()

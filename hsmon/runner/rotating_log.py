"""An append-only log file with size-based rotation that never loses the tail.

Rotation renames (``LOG`` -> ``LOG.1`` -> ``LOG.2`` ...) and opens a new ``LOG``: nothing is
truncated or copied, so the newest bytes are always in ``LOG`` (and the ones before in ``LOG.1``),
and a reader that holds the old file open still reads it to its end. Rotation happens at a line
boundary (a file may pass the limit by the end of its last line); a line longer than the limit is
written whole into a file of its own.
"""

from __future__ import annotations

import os
import threading
from typing import IO

from hsmon.contracts import nofollow


class RotatingLog:
    """Writes bytes as they come (flushed at once) to ``path``, rotating past ``max_bytes``."""

    def __init__(self, path: str, max_bytes: int = 64 * 1024 * 1024, backups: int = 3) -> None:
        if max_bytes <= 0 or backups < 1:
            raise ValueError("max_bytes must be positive and backups at least 1")
        self.path, self.max_bytes, self.backups = path, max_bytes, backups
        self._lock = threading.Lock()
        self._fh = self._open()
        self._size = os.fstat(self._fh.fileno()).st_size
        self._at_line_start = True  # (an existing file ending mid-line: its next line goes on)
        self.bytes_total = 0  # written by this writer, across rotations
        self.lines_total = 0
        self.rotations = 0

    def write(self, data: bytes) -> None:
        """Append ``data`` now; when it would pass the limit, first finish the current line in this
        file, then rotate, so that the newest lines always open the new file."""
        if not data:
            return
        with self._lock:
            self.bytes_total += len(data)
            self.lines_total += data.count(b"\n")
            while data:
                if self._size and self._size + len(data) > self.max_bytes:
                    if not self._at_line_start:
                        cut = data.find(b"\n") + 1
                        if not cut:
                            break  # still inside a line: it goes on in this file
                        self._write(data[:cut])
                        data = data[cut:]
                        continue
                    self._rotate()
                if len(data) > self.max_bytes:  # a burst: whole lines up to the limit per file
                    cut = data.rfind(b"\n", 0, self.max_bytes) + 1 or data.find(b"\n") + 1 or len(data)
                else:
                    cut = len(data)
                self._write(data[:cut])
                data = data[cut:]
            if data:
                self._write(data)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = self._fh.write(view)
            view = view[n:]
        self._size += len(data)
        if data:
            self._at_line_start = data.endswith(b"\n")

    def _rotate(self) -> None:
        self._fh.close()
        for i in range(self.backups - 1, 0, -1):
            src = f"{self.path}.{i}"
            if os.path.exists(src):
                os.replace(src, f"{self.path}.{i + 1}")
        os.replace(self.path, f"{self.path}.1")
        self._fh = self._open()
        self._size = 0
        self.rotations += 1

    def _open(self) -> IO[bytes]:
        fd = nofollow.open_file(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # never through a link
        return open(fd, "ab", buffering=0)

    def close(self) -> None:
        with self._lock:
            self._fh.close()

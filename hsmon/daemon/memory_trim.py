"""Give the allocator's free memory back to the system now and then: a daemon that runs for weeks.

Jobs come and go (a reload, a retired job's grace): the memory they used is freed but glibc keeps
it in its heaps for reuse, so the RSS a service manager reads (and MemoryMax= limits) steps up
with the busiest moment seen and never comes down. Measured in the soak (bench/soak.py, idle, 60
min, 320 jobs): RSS steps of +0.25 and +0.9 MB at two moments, flat between them and flat with no
job: free memory kept, not a leak (docs/benchmarks.md, "Soak"). ``malloc_trim(0)`` returns the free
pages of every arena. A tick listener calls it at most every ``every_s``; off glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time
from collections.abc import Callable

TRIM_EVERY_S = 300.0


def glibc_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


class MemoryTrim:
    """A tick listener: ``malloc_trim(0)`` once ``every_s`` has passed since the last call."""

    def __init__(self, every_s: float = TRIM_EVERY_S, trim: Callable[[int], int] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s, self.clock = every_s, clock
        self.trim = trim if trim is not None else glibc_malloc_trim()
        self.last = clock()
        self.trims_total = 0

    def __call__(self) -> None:
        now = self.clock()
        if self.trim is None or now - self.last < self.every_s:
            return
        self.last = now
        self.trim(0)
        self.trims_total += 1

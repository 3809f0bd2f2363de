"""The daemon's periodic malloc_trim (hsmon/daemon/memory_trim.py)."""

from __future__ import annotations

import ctypes
import sys

import pytest

from hsmon.daemon.memory_trim import MemoryTrim, glibc_malloc_trim


def test_it_trims_at_most_once_per_interval():
    calls: list[int] = []
    now = [100.0]
    trim = MemoryTrim(300.0, trim=lambda pad: calls.append(pad) or 1, clock=lambda: now[0])
    for t in (100.0, 250.0, 399.9):
        now[0] = t
        trim()
    assert calls == []
    now[0] = 400.0
    trim()
    now[0] = 500.0
    trim()
    assert calls == [0] and trim.trims_total == 1
    now[0] = 700.0
    trim()
    assert calls == [0, 0] and trim.trims_total == 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim: Linux")
def test_glibcs_malloc_trim_is_found_and_returns_free_memory():
    """On this glibc machine the real function is found; after freeing a large heap of small blocks
    it reports memory given back (1), which is what lowers the daemon's RSS."""
    trim = glibc_malloc_trim()
    assert trim is not None
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(1024) for _ in range(20_000)]  # 20 MB under the mmap threshold: the heap
    for block in blocks:
        libc.free(block)
    assert trim(0) == 1
    MemoryTrim(0.0, trim=trim)()  # the listener calls the real one without error

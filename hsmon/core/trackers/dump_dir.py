"""Dump directory tracker (e.g. /dev/shm/sglang_hs): files, bytes, oldest file, created/consumed.

Two sources feed one in-memory table of the directory's entries:
- filesystem events (watchdog), which are fast but lossy under load, and
- ``scan()``, a full listing that reconciles the table exactly (periodic, and at once after an
  inotify queue overflow).
A scan and events can interleave: names touched by an event while a listing runs keep the
event's verdict, so the scan never undoes a newer event. ``snapshot()`` reads memory only.
"""

from __future__ import annotations

import contextlib
import heapq
import os
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from hsmon.core.trackers.families import add_sample as _add
from hsmon.core.trackers.families import counter as _c
from hsmon.core.trackers.families import gauge as _g
from hsmon.core.trackers.rates import RateWindow
from hsmon.status_doc import DumpSection, JobStatus


class DumpDirTracker:
    """Entries directly inside ``path`` (files, or per-request subdirectories)."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self._lock = threading.Lock()
        self._files: dict[str, tuple[int, float]] = {}  # name -> (bytes, mtime)
        self._bytes = 0
        self._heap: list[tuple[float, str]] = []  # (mtime, name), lazily cleaned
        self._touched: set[str] | None = None  # names changed by events during a running scan
        self.created_total = 0
        self.consumed_total = 0
        self.events_total = 0
        self.scans_total = 0
        self.scans_skipped_total = 0
        self._listed_identity: tuple[int, int] | None = None
        self.scan_seconds_last = 0.0
        self.exists = False
        self.error: str | None = None
        self.dir_inode: int | None = None
        self.last_change_ts: float | None = None
        self._created_rate = RateWindow(30.0)
        self._consumed_rate = RateWindow(30.0)
        self.newest_mtime: float | None = None  # of the last scan's entries: work before we watched

    # -- events (watchdog thread) --------------------------------------------------------------
    def _name_of(self, path: str | bytes) -> str | None:
        path = os.fsdecode(path)
        parent, name = os.path.split(path)
        return name if parent == self.path and name else None

    def _stat(self, name: str) -> tuple[int, float] | None:
        try:
            st = os.stat(os.path.join(self.path, name))
        except OSError:
            return None
        return st.st_size, st.st_mtime

    def _put(self, name: str, info: tuple[int, float]) -> None:
        old = self._files.get(name)
        if old is not None:
            self._bytes -= old[0]
        self._files[name] = info
        self._bytes += info[0]
        if old is None or old[1] != info[1]:
            heapq.heappush(self._heap, (info[1], name))

    def _drop(self, name: str) -> bool:
        old = self._files.pop(name, None)
        if old is None:
            return False
        self._bytes -= old[0]
        return True

    def on_created(self, path: str | bytes) -> None:
        name = self._name_of(path)
        if name is None:
            return
        info = self._stat(name)
        with self._lock:
            self.events_total += 1
            if self._touched is not None:
                self._touched.add(name)
            self.last_change_ts = time.time()
            known = name in self._files
            if info is None:  # already consumed: it existed and is gone
                if known:
                    self._drop(name)
                    self.consumed_total += 1
                else:
                    self.created_total += 1
                    self.consumed_total += 1
                return
            if not known:
                self.created_total += 1
            self._put(name, info)

    def on_changed(self, path: str | bytes) -> None:
        """A file was written and closed (or moved in): refresh its size."""
        name = self._name_of(path)
        if name is None:
            return
        info = self._stat(name)
        if info is None:
            return
        with self._lock:
            self.events_total += 1
            if self._touched is not None:
                self._touched.add(name)
            if name not in self._files:
                self.created_total += 1
                self.last_change_ts = time.time()
            self._put(name, info)

    def on_deleted(self, path: str | bytes) -> None:
        name = self._name_of(path)
        if name is None:
            return
        with self._lock:
            self.events_total += 1
            if self._touched is not None:
                self._touched.add(name)
            if self._drop(name):
                self.consumed_total += 1
                self.last_change_ts = time.time()

    # -- reconciliation (scanner thread) -------------------------------------------------------
    def scan(self, full: bool = True) -> bool:
        """List the directory and make the table exact; returns whether it listed.

        With ``full=False`` the listing is skipped when the directory's inode and mtime are those of
        the last listing: no entry was added, removed or renamed since. (Sizes of files rewritten
        in place are then known from close events; an inotify overflow forces a full scan.)
        """
        if not full and self._unchanged_since_listing():
            with self._lock:
                self.scans_skipped_total += 1
            return False
        started = time.perf_counter()
        with self._lock:
            self._touched = set()
        listed, exists, error, inode, identity = _list_dir(self.path)
        with self._lock:
            touched, self._touched = self._touched or set(), None
            baseline = self.scans_total == 0  # what is there when watching begins was not seen created
            self.scans_total += 1
            self.scan_seconds_last = time.perf_counter() - started
            self.exists, self.error = exists, error
            if error is not None:
                return True  # keep what we knew: an unreadable directory says nothing new
            if not exists or (self.dir_inode is not None and inode != self.dir_inode):
                # deleted (or replaced): its old entries are gone, not consumed
                self._files.clear()
                self._heap.clear()
                self._bytes = 0
            self.dir_inode = inode
            self._listed_identity = identity
            self.newest_mtime = max((m for _, m in listed.values()), default=self.newest_mtime)
            changed = False
            for name in [n for n in self._files if n not in listed and n not in touched]:
                self._drop(name)
                self.consumed_total += 1
                changed = True
            for name, info in listed.items():
                if name in touched:
                    continue
                if name not in self._files:
                    self.created_total += 0 if baseline else 1
                    changed = True
                if self._files.get(name) != info:
                    self._put(name, info)
            if changed and self.scans_total > 1:  # the first scan is a baseline, not work
                self.last_change_ts = time.time()
            if len(self._heap) > 2 * len(self._files) + 1024:
                self._heap = [(mtime, name) for name, (_, mtime) in self._files.items()]
                heapq.heapify(self._heap)
        return True

    def _unchanged_since_listing(self) -> bool:
        """The directory's inode and mtime are those of the last listing (and it was readable)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return self.error is None and (st.st_ino, st.st_mtime_ns) == self._listed_identity

    def forget_watch_identity(self) -> None:
        """The directory was seen deleted by an event: the next scan starts from a clean table."""
        with self._lock:
            self.dir_inode = -1

    def sample_rates(self, now: float) -> None:
        """Record the counters for the per-second rates (the monitor calls this every tick)."""
        with self._lock:
            self._created_rate.add(now, self.created_total)
            self._consumed_rate.add(now, self.consumed_total)

    # -- reading (any thread, memory only) -----------------------------------------------------
    def snapshot(self, now: float | None = None) -> DumpSection:
        """The job's ``dump`` section (hsmon.status_doc), from memory."""
        now = time.time() if now is None else now
        with self._lock:
            while self._heap:
                mtime, name = self._heap[0]
                info = self._files.get(name)
                if info is not None and info[1] == mtime:
                    break
                heapq.heappop(self._heap)
            oldest = max(0.0, now - self._heap[0][0]) if self._heap else None
            return DumpSection(
                path=self.path,
                exists=self.exists,
                error=self.error,
                files=len(self._files) if self.error is None or self._files else None,
                bytes=self._bytes,
                oldest_age_s=oldest,
                created_total=self.created_total,
                consumed_total=self.consumed_total,
                created_per_s=self._created_rate.rate(),
                consumed_per_s=self._consumed_rate.rate(),
            )

def _list_dir(path: str) -> tuple[dict[str, tuple[int, float]], bool, str | None, int | None,
                                  tuple[int, int] | None]:
    """One listing of ``path``: name -> (bytes, mtime), whether it exists, the error that stopped
    the listing (None), the directory's inode and its (inode, mtime_ns) identity."""
    listed: dict[str, tuple[int, float]] = {}
    exists, error, inode, identity = True, None, None, None
    try:
        dir_stat = os.stat(path)  # before listing: a change during the listing is seen next time
        inode = dir_stat.st_ino
        identity = (dir_stat.st_ino, dir_stat.st_mtime_ns)
        with os.scandir(path) as it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # consumed while we listed
                size = _dir_bytes(entry.path) if entry.is_dir(follow_symlinks=False) else st.st_size
                listed[entry.name] = (size, st.st_mtime)
    except FileNotFoundError:
        exists = False
    except NotADirectoryError:
        error = f"{path} is not a directory"
    except PermissionError:
        error = f"permission denied reading {path}"
    except OSError as exc:
        error = f"cannot read {path}: {exc.strerror}"
    return listed, exists, error, inode, identity


def _dir_bytes(path: str) -> int:
    total = 0
    try:
        with os.scandir(path) as it:
            for entry in it:
                with contextlib.suppress(OSError):
                    total += entry.stat(follow_symlinks=False).st_size
    except OSError:
        pass
    return total


# -- its Prometheus families (hsmon/core/job_trackers.py TRACKER_METRICS; docs/metrics.md) ----------------
def metrics(jobs: Sequence[JobStatus], monitor: Any = None) -> Iterator[Any]:
    """The dump directory's families (the ``dump`` section; the Monitor's inotify counters)."""
    files = _g("hsmon_dump_files", "files in the dump directory")
    nbytes = _g("hsmon_dump_bytes", "bytes in the dump directory")
    oldest = _g("hsmon_dump_oldest_file_age_seconds", "age of the oldest dump file")
    created = _c("hsmon_dump_files_created_total", "dump files seen created")
    consumed = _c("hsmon_dump_files_consumed_total", "dump files seen consumed (deleted)")
    exists = _g("hsmon_dump_dir_exists", "1 when the dump directory exists")
    for job in jobs:
        d = job.dump
        if not d:
            continue
        label = [job.job]
        _add(files, label, d.files)
        _add(nbytes, label, d.bytes)
        _add(oldest, label, d.oldest_age_s)
        _add(created, label, d.created_total)
        _add(consumed, label, d.consumed_total)
        exists.add_metric(label, 1.0 if d.exists else 0.0)
    counters = monitor.dump_counters() if monitor is not None else {}
    events = _c("hsmon_dump_fs_events_total", "filesystem events handled for the dump directory")
    for name, c in counters.items():
        events.add_metric([name], c["events_total"])
    yield from (files, nbytes, oldest, created, consumed, exists, events)

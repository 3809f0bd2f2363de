"""Disk headroom for the output filesystem and /dev/shm.

``usage()`` is the only I/O (statvfs of the path, or of its nearest existing parent); the
arithmetic is ``headroom()``, a pure function returning the status document's typed entry.
``DiskTracker`` is a job's: it polls ``usage()`` of its filesystems and answers its ``disk``
entries from the output and dump sections of the same tick (hsmon/core/job_trackers.py ``DiskJob``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from hsmon.core.trackers.families import add_sample as _add
from hsmon.core.trackers.families import gauge as _g
from hsmon.core.trackers.rates import RateWindow
from hsmon.status_doc import DiskEntry, DumpSection, JobStatus, OutputSection, Progress


class FsUsage(NamedTuple):
    """What statvfs says of a filesystem: bytes and inodes free for unprivileged writers, and in
    all. The inodes are None when the filesystem reports none (no fixed limit: btrfs, some FUSE)."""

    free: int
    total: int
    free_inodes: int | None = None
    total_inodes: int | None = None


def usage(path: str) -> FsUsage | None:
    """The bytes and inodes free and in all of the filesystem holding ``path`` (or its nearest
    existing parent); None when it cannot be read."""
    probe = os.path.abspath(path)
    while True:
        try:
            st = os.statvfs(probe)
            limited = st.f_files > 0
            return FsUsage(st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize,
                           st.f_favail if limited else None, st.f_files if limited else None)
        except FileNotFoundError:
            parent = os.path.dirname(probe)
            if parent == probe:
                return None
            probe = parent
        except OSError:
            return None


def needed_bytes(
    bytes_done: float | None, rows_done: int | None, rows_total: int | None, estimate: float | None = None
) -> float | None:
    """Bytes still to write: the job's own estimate, else bytes per row so far × rows left."""
    if estimate is not None:
        return max(0.0, float(estimate))
    if not bytes_done or not rows_done or rows_total is None:
        return None
    return max(0, rows_total - rows_done) * (bytes_done / rows_done)


def needed_inodes(
    rows_done: int | None, rows_total: int | None, chunks_started: int | None, chunks_total: int | None
) -> int | None:
    """Files still to create in the output (hsmon/contracts/layout.py: one file per row and one
    directory per chunk): rows left + chunks not started yet; None unless both totals are known."""
    if rows_total is None or chunks_total is None:
        return None
    return max(0, rows_total - (rows_done or 0)) + max(0, chunks_total - (chunks_started or 0))


def headroom(
    role: str,
    path: str,
    fs: tuple[int, ...] | None,
    needed: float | None,
    write_bytes_per_s: float | None,
    time_to_done_s: float | None,
    inodes_needed: int | None = None,
) -> DiskEntry:
    """One entry of the status document's ``disk`` list (``fs``: ``usage()``'s, or (free, total)).

    fits: false when the files still to create need more inodes than are free; else needed <= free
    when the need is known; else time to full >= time to done when both are; else null.
    time_to_full_s is null unless the filesystem is being filled (positive rate).
    """
    usage_ = FsUsage(*fs) if fs else None
    free, total = (usage_.free, usage_.total) if usage_ else (None, None)
    free_inodes = usage_.free_inodes if usage_ else None
    rate = write_bytes_per_s if write_bytes_per_s and write_bytes_per_s > 0 else None
    time_to_full = free / rate if (free is not None and rate) else None
    fits: bool | None = None
    if free is not None and needed is not None:
        fits = needed <= free
    elif time_to_full is not None and time_to_done_s is not None:
        fits = time_to_full >= time_to_done_s
    entry = DiskEntry(
        role=role,
        path=path,
        free_bytes=free,
        total_bytes=total,
        needed_bytes=needed,
        fits=fits,
        write_bytes_per_s=write_bytes_per_s,
        time_to_full_s=time_to_full,
        time_to_done_s=time_to_done_s,
        free_inodes=free_inodes,
        total_inodes=usage_.total_inodes if usage_ else None,
        needed_inodes=inodes_needed,
    )
    if entry.short_of_inodes():
        entry.fits = False  # out of inodes before bytes: a file per row
    return entry


class DiskTracker:
    """One job's filesystems: the output's (``out_dir``) and the dump directory's (``shm_path``);
    each None when the job has none. ``poll`` reads them (statvfs); ``entries`` is arithmetic."""

    def __init__(self, out_dir: str | None, shm_path: str | None, needed_estimate: float | None) -> None:
        self.out_dir, self.shm_path, self.needed_estimate = out_dir, shm_path, needed_estimate
        self.out_bytes_rate = RateWindow(60.0)  # the output's write rate (also progress.bytes_per_s)
        self._shm_bytes_rate = RateWindow(30.0)
        self._out_fs: FsUsage | None = None
        self._shm_fs: FsUsage | None = None

    def poll(self) -> None:
        """Read the filesystems' free and total bytes and inodes."""
        self._out_fs = usage(self.out_dir) if self.out_dir is not None else None
        self._shm_fs = usage(self.shm_path) if self.shm_path is not None else None

    def entries(self, now: float, dump: DumpSection | None, out: OutputSection | None,
                rows_total: int | None, progress: Progress | None,
                spool_room: int | None = None) -> list[DiskEntry]:
        """Headroom (bytes and inodes) of the output filesystem and of the dump directory's (shm)
        one, from this tick's output and dump sections and the job's merged progress. For a spool
        (``spool_room``: its limit less the bytes in it) what is still written on top of today's
        files is at most that room, not the rest of the dataset."""
        disks: list[DiskEntry] = []
        eta = progress.eta_s if progress else None
        if out is not None and self.out_dir is not None:
            self.out_bytes_rate.add(now, out.bytes or 0)
            needed = needed_bytes(out.bytes, out.rows, rows_total, self.needed_estimate)
            if spool_room is not None:
                needed = spool_room if needed is None else min(needed, float(spool_room))
            started = (out.chunks_complete or 0) + (out.chunks_in_progress or 0)
            files = needed_inodes(out.rows, rows_total, started,
                                  progress.chunks_total if progress else None)
            disks.append(headroom("output", self.out_dir, self._out_fs, needed,
                                  self.out_bytes_rate.rate(), eta, files))
        if self.shm_path is not None:
            self._shm_bytes_rate.add(now, max(0, dump.bytes if dump is not None else 0))
            rate = self._shm_bytes_rate.rate()
            disks.append(headroom("shm", self.shm_path, self._shm_fs, None,
                                  rate if rate and rate > 0 else None, eta))
        return disks


def shortfall_message(entry: DiskEntry | None) -> str | None:
    """Why the filesystem of a ``headroom`` entry will not do (for the disk hints), None without one."""
    if entry is None:
        return None
    from hsmon.contracts.units import format_bytes, format_duration

    if entry.short_of_inodes():
        bytes_too = entry.needed_bytes is not None and entry.free_bytes is not None and (
            entry.needed_bytes > entry.free_bytes)
        space = f" and ~{format_bytes(entry.needed_bytes)} with {format_bytes(entry.free_bytes)} free" \
            if bytes_too else ""
        return (
            f"{entry.role} filesystem of {entry.path}: needs ~{entry.needed_inodes:,} more files, "
            f"{entry.free_inodes:,} inodes free{space}: free inodes (delete files, or a filesystem with "
            "more inodes) before it runs out"
        )
    if entry.needed_bytes is not None and entry.free_bytes is not None:
        return (
            f"{entry.role} filesystem of {entry.path}: needs ~{format_bytes(entry.needed_bytes)}, "
            f"{format_bytes(entry.free_bytes)} free: free space before it fills"
        )
    return (
        f"{entry.role} filesystem of {entry.path} fills in {format_duration(entry.time_to_full_s)}, "
        f"before the job is done (in {format_duration(entry.time_to_done_s)})"
    )


# -- its Prometheus families (hsmon/core/job_trackers.py TRACKER_METRICS; docs/metrics.md) ----------------
def metrics(jobs: Sequence[JobStatus], monitor: Any = None) -> Iterator[Any]:
    """The disk families (the ``disk`` entries, labelled by role)."""
    labels = ("job", "role")
    fams = {
        "free_bytes": _g("hsmon_disk_free_bytes", "free bytes on the filesystem", labels),
        "total_bytes": _g("hsmon_disk_size_bytes", "size of the filesystem", labels),
        "needed_bytes": _g("hsmon_disk_needed_bytes", "bytes the job still needs to write", labels),
        "write_bytes_per_s": _g("hsmon_disk_write_bytes_per_second", "how fast the job fills it", labels),
        "time_to_full_s": _g(
            "hsmon_disk_time_to_full_seconds", "seconds until full at that rate", labels
        ),
        "time_to_done_s": _g("hsmon_disk_time_to_done_seconds", "seconds until the job is done", labels),
        "free_inodes": _g("hsmon_disk_free_inodes", "free inodes on the filesystem (absent: no inode limit)",
                          labels),
        "needed_inodes": _g("hsmon_disk_needed_inodes", "files the job still needs to create (rows and "
                            "chunk directories left)", labels),
    }
    fits = _g(
        "hsmon_disk_fits", "1 if what the job still writes fits, 0 if not (absent: unknown)", labels
    )
    for job in jobs:
        for d in job.disk:
            label = [job.job, d.role]
            for key, fam in fams.items():
                _add(fam, label, getattr(d, key))
            if d.fits is not None:
                fits.add_metric(label, 1.0 if d.fits else 0.0)
    yield from (*fams.values(), fits)

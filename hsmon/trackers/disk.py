"""Disk headroom for the output filesystem and /dev/shm.

``usage()`` is the only I/O (statvfs of the path, or of its nearest existing parent); the
arithmetic is ``headroom()``, a pure function returning the status document's typed entry.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

from hsmon.status_doc import DiskEntry, JobStatus
from hsmon.trackers.families import add_sample as _add
from hsmon.trackers.families import gauge as _g


def usage(path: str) -> tuple[int, int] | None:
    """(free bytes for unprivileged writers, total bytes) of the filesystem holding ``path``."""
    probe = os.path.abspath(path)
    while True:
        try:
            st = os.statvfs(probe)
            return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
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


def headroom(
    role: str,
    path: str,
    fs: tuple[int, int] | None,
    needed: float | None,
    write_bytes_per_s: float | None,
    time_to_done_s: float | None,
) -> DiskEntry:
    """One entry of the status document's ``disk`` list.

    fits: needed <= free when the need is known; else time to full >= time to done when both are;
    else null. time_to_full_s is null unless the filesystem is being filled (positive rate).
    """
    free, total = fs if fs else (None, None)
    rate = write_bytes_per_s if write_bytes_per_s and write_bytes_per_s > 0 else None
    time_to_full = free / rate if (free is not None and rate) else None
    fits: bool | None = None
    if free is not None and needed is not None:
        fits = needed <= free
    elif time_to_full is not None and time_to_done_s is not None:
        fits = time_to_full >= time_to_done_s
    return DiskEntry(
        role=role,
        path=path,
        free_bytes=free,
        total_bytes=total,
        needed_bytes=needed,
        fits=fits,
        write_bytes_per_s=write_bytes_per_s,
        time_to_full_s=time_to_full,
        time_to_done_s=time_to_done_s,
    )

def shortfall_message(entry: DiskEntry | None) -> str | None:
    """Why the filesystem of a ``headroom`` entry will not do (for the disk hints), None without one."""
    if entry is None:
        return None
    from hsmon.contracts.units import format_bytes, format_duration

    if entry.needed_bytes is not None and entry.free_bytes is not None:
        return (
            f"{entry.role} filesystem of {entry.path}: needs ~{format_bytes(entry.needed_bytes)}, "
            f"{format_bytes(entry.free_bytes)} free: free space before it fills"
        )
    return (
        f"{entry.role} filesystem of {entry.path} fills in {format_duration(entry.time_to_full_s)}, "
        f"before the job is done (in {format_duration(entry.time_to_done_s)})"
    )


# -- its Prometheus families (hsmon/job_trackers.py TRACKER_METRICS; docs/metrics.md) ----------------
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

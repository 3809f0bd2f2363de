"""The output filesystem's inodes (a figure added end to end): a million-row extraction
writes a file per row and a directory per chunk, and can run out of inodes before bytes. Measured
for real on a tmpfs mounted with few inodes (root only), and the arithmetic on its own."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from synthetic_output import write_synthetic_output

from hsmon.contracts import events as ev
from hsmon.core.config import JobConfig
from hsmon.core.monitor import Monitor
from hsmon.core.trackers import disk
from hsmon.metrics.exporter import MetricsEndpoint
from hsmon.status.cli import render


@contextlib.contextmanager
def _tmpfs(where: Path, inodes: int) -> Iterator[Path]:
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size=64m,nr_inodes={inodes}", "tmpfs", str(where)],
                   check=True)
    try:
        yield where
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            subprocess.run(["umount", "-l", str(where)], check=True)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[dict[str, Path]]:
    """Two 64 MiB tmpfs: one with 64 inodes, one with 100,000."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a tmpfs")
    with _tmpfs(tmp_path / "few", 64) as few, _tmpfs(tmp_path / "roomy", 100_000) as roomy:
        yield {"few": few, "roomy": roomy}


def _job(tmp_path: Path, root: Path, name: str) -> JobConfig:
    """An extraction of 2,000 rows in chunks of 100, 100 rows written (tiny rows: the bytes fit)."""
    out = root / "out"
    write_synthetic_output(out, 2000, chunk_size=100, done=range(100), settings={"chunk_size": 100},
                           lengths=[1] * 2000)
    events = tmp_path / f"{name}.jsonl"
    with ev.EventWriter(name, events) as w:
        w.emit(ev.START, rows_total=2000, chunks_total=20)
    return JobConfig(name=name, events=str(events), out_dir=str(out))


def test_an_output_with_more_rows_left_than_inodes_free_will_not_fit(
    tmp_path: Path, tmpfs: dict[str, Path]
) -> None:
    monitor = Monitor([_job(tmp_path, tmpfs["few"], "few"), _job(tmp_path, tmpfs["roomy"], "roomy")],
                      use_watchdog=False)
    try:
        monitor.tick(force_scan=True)
        jobs = {job.job: job for job in monitor.status().jobs}
        few = next(d for d in jobs["few"].disk if d.role == "output")
        roomy = next(d for d in jobs["roomy"].disk if d.role == "output")
        st = os.statvfs(tmpfs["few"])
        assert (few.free_inodes, few.total_inodes) == (st.f_favail, st.f_files) and few.total_inodes <= 64
        assert few.needed_inodes == roomy.needed_inodes == 1900 + 19  # rows left + chunks not started
        assert few.needed_bytes is not None and few.needed_bytes < few.free_bytes  # the bytes fit
        assert few.fits is False and roomy.fits is True  # the inodes do not, on the small one
        (hint,) = [h for h in jobs["few"].hints if h.id == "disk-wont-fit"]
        assert f"needs ~1,919 more files, {few.free_inodes:,} inodes free" in hint.message, hint.message
        assert not any(h.id == "disk-wont-fit" for h in jobs["roomy"].hints)
        text = MetricsEndpoint(monitor).render().decode()
        assert f'hsmon_disk_free_inodes{{job="few",role="output"}} {float(few.free_inodes)}' in text
        assert 'hsmon_disk_needed_inodes{job="few",role="output"} 1919.0' in text
        assert 'hsmon_disk_fits{job="few",role="output"} 0.0' in text
        table = render(monitor.status())
        assert f"needs 1,919 files, {few.free_inodes:,} inodes free" in table
        disk_rows = [line for line in table.splitlines() if line.strip().startswith("disk output")]
        assert len(disk_rows) == 2  # shown only where the inodes are the limit
        assert sum("inodes free" in line for line in disk_rows) == 1, disk_rows
    finally:
        monitor.stop()


def test_inodes_are_the_limit_only_when_both_figures_are_known() -> None:
    fs = disk.FsUsage(10**9, 2 * 10**9, 500, 1000)
    short = disk.headroom("output", "/x", fs, 1e6, None, None, inodes_needed=501)
    assert short.fits is False and short.short_of_inodes()
    message = disk.shortfall_message(short)
    assert message is not None and "needs ~501 more files, 500 inodes free" in message
    assert disk.headroom("output", "/x", fs, 1e6, None, None, inodes_needed=500).fits is True
    # no inode limit (f_files 0) or the totals unknown: the bytes alone decide, as before
    assert disk.headroom("output", "/x", disk.FsUsage(10**9, 2 * 10**9), 1e6, None, None, 10**9).fits is True
    assert disk.headroom("output", "/x", fs, 1e6, None, None, None).fits is True
    assert disk.needed_inodes(100, 2000, 1, 20) == 1919 and disk.needed_inodes(100, 2000, 1, None) is None
    both = disk.headroom("output", "/x", fs, 3e9, None, None, inodes_needed=501)
    message = disk.shortfall_message(both) or ""
    assert "more files" in message and "3.0 GB" in message, message

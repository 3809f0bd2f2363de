"""The trackers on a real filesystem, with real processes."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from daemon_helpers import STORY, child_env, procs, wait_until  # noqa: F401

from hsmon.contracts import events as ev
from hsmon.core.config import JobConfig, ProcessSpec
from hsmon.core.monitor import Monitor
from hsmon.core.trackers import disk
from hsmon.core.trackers.dump_dir import DumpDirTracker
from hsmon.core.trackers.output_dir import OutputDirTracker
from hsmon.core.trackers.processes import ProcessTracker, python_unbuffered, stdout_block_buffered
from hsmon.core.trackers.progress import ProgressTracker


def touch(path: Path, size: int = 10) -> None:
    path.write_bytes(b"x" * size)


# -- dump directory ---------------------------------------------------------------------------
def test_dump_scan_counts_created_consumed_bytes_and_oldest(tmp_path):
    d = tmp_path / "dump"
    t = DumpDirTracker(str(d))
    t.scan()
    assert t.snapshot().exists is False
    d.mkdir()
    for i in range(5):
        touch(d / f"req_{i}", 100)
    old = time.time() - 50
    os.utime(d / "req_0", (old, old))
    t.scan()
    s = t.snapshot()
    assert (s.exists, s.files, s.bytes, s.created_total, s.consumed_total) == (
        True,
        5,
        500,
        5,
        0,
    )
    assert 49 < s.oldest_age_s < 60
    (d / "req_0").unlink()
    (d / "req_1").unlink()
    touch(d / "req_9", 1)
    t.scan()
    s = t.snapshot()
    assert (s.files, s.bytes, s.created_total, s.consumed_total) == (4, 301, 6, 2)
    assert s.oldest_age_s < 40


def test_dump_dir_deleted_and_recreated_mid_run_with_watchdog(tmp_path):
    d = tmp_path / "dump"
    m = Monitor([JobConfig(name="j", dump_dir=str(d), stall_after=30)], scan_interval=60.0, tick_interval=0.2)
    m.start()
    try:

        def dump():
            return m.status_document()["jobs"][0]["dump"]

        assert dump()["exists"] is False
        d.mkdir()
        for i in range(3):
            touch(d / f"a{i}")
        # scans are 60 s apart: only the watch (scheduled when the directory appeared) or the
        # appearance check can bring these in
        wait_until(lambda: dump()["files"] == 3, 10, what="3 files")
        touch(d / "a3")
        wait_until(lambda: dump()["files"] == 4, 5, what="file seen by watchdog")
        shutil.rmtree(d)
        wait_until(lambda: dump()["exists"] is False and dump()["files"] == 0, 10, what="deleted dir")
        d.mkdir()
        touch(d / "b0")
        touch(d / "b1")
        wait_until(lambda: dump()["exists"] and dump()["files"] == 2, 10, what="recreated dir")
        touch(d / "b2")
        wait_until(lambda: dump()["files"] == 3, 5, what="watch on the recreated dir")
    finally:
        m.stop()


def test_unreadable_dump_and_output_dirs(tmp_path):
    """Root reads everything, so as root `hsmon status` runs without the capabilities that let it."""
    d, o = tmp_path / "dump", tmp_path / "out"
    d.mkdir()
    o.mkdir()
    touch(d / "req_0")
    os.chmod(d, 0o000)
    os.chmod(o, 0o000)
    drop = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    try:
        res = subprocess.run(
            [
                *drop,
                sys.executable,
                "-m",
                "hsmon",
                "status",
                "--dump-dir",
                str(d),
                "--out",
                str(o),
                "--json",
                "--sample",
                "0.1",
            ],
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        os.chmod(d, 0o755)
        os.chmod(o, 0o755)
    assert res.returncode in (0, 1), res.stderr
    job = json.loads(res.stdout)["jobs"][0]
    assert "permission denied" in job["dump"]["error"]
    assert "permission denied" in job["output"]["error"]


# -- output directory -------------------------------------------------------------------------
def test_output_hsmon_layout_from_a_real_story_run(tmp_path):
    out = tmp_path / "out"
    subprocess.run(
        [
            sys.executable,
            STORY,
            str(tmp_path / "dump"),
            str(out),
            "--rows",
            "25",
            "--delay",
            "0",
            "--chunk-size",
            "10",
            "--manifest",
        ],
        env=child_env(),
        check=True,
        timeout=60,
    )
    (out / "rows_20-30" / ".data_25.ckpt.tmp-1").write_bytes(b"partial")
    t = OutputDirTracker(str(out))
    t.scan()
    s = t.snapshot()
    assert s.layout == "hsmon"
    assert (s.rows, s.chunks_complete, s.chunks_in_progress, s.temp_files) == (25, 2, 1, 1)
    assert s.bytes == 25 * 4096 and s.tokens == 25 * 256


def test_output_specforge_layout_and_mtime_cache(tmp_path):
    out = tmp_path / "out"
    for row in range(7):
        a = (row // 4) * 4
        (out / f"rows_{a}-{a + 4}").mkdir(parents=True, exist_ok=True)
        touch(out / f"rows_{a}-{a + 4}" / f"data_{row}.ckpt", 1000)
    t = OutputDirTracker(str(out))
    t.scan()
    s = t.snapshot()
    assert (s.layout, s.rows, s.bytes, s.chunks_complete, s.chunks_in_progress) == (
        "specforge",
        7,
        7000,
        1,
        1,
    )
    assert s.tokens is None
    touch(out / "rows_4-8" / "data_7.ckpt", 10)
    t.scan()
    s = t.snapshot()
    assert (s.rows, s.bytes, s.chunks_complete, s.chunks_in_progress) == (8, 7010, 2, 0)


def write_safetensors(path: Path, seq: int) -> None:
    header = {
        "input_ids": {"dtype": "I64", "shape": [seq], "data_offsets": [0, 8 * seq]},
        "hidden_states": {"dtype": "BF16", "shape": [seq, 4], "data_offsets": [8 * seq, 16 * seq]},
    }
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * (16 * seq))


def test_output_speculators_layout_reads_tokens_from_headers(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    write_safetensors(out / "hs_0.safetensors", 11)
    (out / "shard1").mkdir()
    write_safetensors(out / "shard1" / "hs_1.safetensors", 5)
    t = OutputDirTracker(str(out))
    t.scan()
    s = t.snapshot()
    assert (s.layout, s.rows, s.tokens) == ("speculators", 2, 16)


def test_output_missing_then_appears(tmp_path):
    t = OutputDirTracker(str(tmp_path / "nope"))
    t.scan()
    assert t.snapshot().exists is False
    (tmp_path / "nope").mkdir()
    t.scan()
    assert t.snapshot().exists is True and t.snapshot().layout == "empty"


# -- events file ------------------------------------------------------------------------------
def test_events_missing_garbage_partial_truncated_rotated(tmp_path):
    path = tmp_path / "events.jsonl"
    t = ProgressTracker(str(path))
    assert t.poll() == 0 and t.snapshot(time.time()).events.exists is False
    w = ev.EventWriter("j", path)
    w.emit(ev.START, rows_total=100, pid=1)
    w.emit(ev.ROWS, rows_done=10, tokens_done=1000)
    with open(path, "a") as fh:
        fh.write('not json at all\n{"no_kind": 1}\n')
        fh.write('{"v":1,"ts":1,"job":"j","kind":"rows","rows_do')  # partial last line
    assert t.poll() == 2
    snap = t.snapshot(time.time())
    assert snap.progress.rows_done == 10 and snap.progress.rows_total == 100
    assert snap.events.bad_lines == 2
    with open(path, "a") as fh:
        fh.write('ne":20,"tokens_done":2000}\n')
    assert t.poll() == 1 and t.snapshot(time.time()).progress.rows_done == 20
    # truncation: the writer starts the file over
    path.write_text("")
    w2 = ev.EventWriter("j", path)
    w2.emit(ev.ROWS, rows_done=30, tokens_done=3000)
    assert t.poll() == 1
    assert t.snapshot(time.time()).progress.rows_done == 30
    assert t.reader.rotations == 1
    # rotation: renamed away, a new file in its place
    os.rename(path, tmp_path / "events.jsonl.1")
    w3 = ev.EventWriter("j", path)
    w3.emit(ev.ROWS, rows_done=40, tokens_done=4000)
    w3.emit(ev.DONE)
    assert t.poll() == 2
    snap = t.snapshot(time.time())
    assert snap.progress.rows_done == 40 and t.terminal_kind == "done"
    assert t.reader.rotations == 2
    for writer in (w, w2, w3):
        writer.close()


def test_events_pause_resume_and_training_fields(tmp_path):
    path = tmp_path / "e.jsonl"
    with ev.EventWriter("t", path) as w:
        w.emit(ev.START, pid=5)
        w.emit(ev.PAUSE, reason="disk")
        t = ProgressTracker(str(path))
        t.poll()
        assert t.paused_reason == "disk"
        w.emit(ev.RESUME)
        w.emit(
            ev.STEP,
            step=2,
            total_steps=10,
            epoch=0,
            loss=3.1,
            losses=[1.6, 2.1],
            accs=[0.5, 0.4],
            tokens=2000,
            tokens_s=900.0,
            ts=time.time() - 1,
        )
        w.emit(
            ev.STEP,
            step=3,
            total_steps=10,
            epoch=0,
            loss=3.0,
            losses=[1.5, 2.0],
            accs=[0.5, 0.4],
            tokens=3000,
            tokens_s=900.0,
        )
        w.emit(ev.CHECKPOINT, path="/x/ckpt-3")
    t.poll()
    snap = t.snapshot(time.time())
    assert t.paused_reason is None and t.pid == 5
    assert snap.training.step == 3 and snap.training.loss == [1.5, 2.0]
    assert snap.training.last_checkpoint == "/x/ckpt-3"
    assert snap.training.acc == [0.5, 0.4] and snap.training.tokens_per_s == 900.0
    assert snap.progress.tokens_done == 3000
    assert 5 < snap.training.eta_s < 9  # 7 steps left at about one step per second


# -- processes --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("cmdline", "env", "expected"),
    [
        (["python3", "x.py"], {}, False),
        (["/usr/bin/python3.11", "-u", "x.py"], {}, True),
        (["python", "-Bu", "x.py"], {}, True),
        (["python", "-X", "dev", "x.py", "-u"], {}, False),
        (["python", "-c", "print(1)", "-u"], {}, False),
        (["python", "-m", "hsmon", "-u"], {}, False),
        (["python", "x.py"], {"PYTHONUNBUFFERED": "1"}, True),
        (["bash", "x.sh"], {}, None),
    ],
)
def test_python_unbuffered(cmdline, env, expected):
    assert python_unbuffered(cmdline, env) is expected


def test_stdout_block_buffered_needs_a_regular_file():
    assert stdout_block_buffered(["python", "x.py"], {}, True)
    assert not stdout_block_buffered(["python", "x.py"], {}, False)
    assert not stdout_block_buffered(["python", "-u", "x.py"], {}, True)


def test_real_process_buffering_detection_and_restarts(tmp_path, procs):  # noqa: F811
    log = open(tmp_path / "log", "wb")  # noqa: SIM115
    code = "import time; print('hi'); time.sleep(60)"
    buffered = procs.start([sys.executable, "-c", code], stdout=log)
    unbuffered = procs.start([sys.executable, "-u", "-c", code], stdout=log)
    to_tty_like = procs.start([sys.executable, "-c", code], stdout=subprocess.PIPE)
    pidfile = tmp_path / "pid"
    pidfile.write_text(f"{buffered.pid}\n")
    t = ProcessTracker(ProcessSpec("extractor", pidfile=str(pidfile)))
    s = t.poll()
    assert s["alive"] and s["pid"] == buffered.pid and s["stdout_buffered"] is True
    assert s["stdout"] == str(tmp_path / "log") and s["threads"] >= 1 and s["rss_bytes"] > 0
    assert ProcessTracker(ProcessSpec("extractor", pid=unbuffered.pid)).poll()["stdout_buffered"] is False
    assert ProcessTracker(ProcessSpec("extractor", pid=to_tty_like.pid)).poll()["stdout_buffered"] is False
    buffered.kill()
    buffered.wait()
    assert t.poll()["alive"] is False
    pidfile.write_text(f"{unbuffered.pid}\n")
    s = t.poll()
    assert s["alive"] and s["pid"] == unbuffered.pid and s["restarts"] == 1
    log.close()


def test_find_process_by_match_prefers_the_real_process_over_its_shell(tmp_path, procs):  # noqa: F811
    marker = f"hsmon_match_marker_{os.getpid()}"
    shell = procs.start(["bash", "-c", f"{sys.executable} -c 'import time; time.sleep(60)' {marker}; true"])
    t = ProcessTracker(ProcessSpec("server", match=marker))
    s = wait_until(lambda: (p := t.poll())["alive"] and p["pid"] != shell.pid and p, 10, what="child")
    assert "python" in s["cmdline"] and s["role"] == "server"
    assert s["restarts"] == 0  # the shell, then its child: one process, not a restart


# -- disk -------------------------------------------------------------------------------------
def test_headroom_arithmetic():
    h = disk.headroom("output", "/x", (1000, 5000), 2000.0, 10.0, 50.0)
    assert h.fits is False and h.time_to_full_s == 100.0
    h = disk.headroom("shm", "/x", (1000, 5000), None, 10.0, 50.0)
    assert h.fits is True
    h = disk.headroom("shm", "/x", (1000, 5000), None, 10.0, 500.0)
    assert h.fits is False
    assert disk.needed_bytes(1000, 10, 30) == 2000
    assert disk.needed_bytes(1000, 10, None) is None
    assert disk.needed_bytes(None, None, None, estimate=5) == 5


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_disk_wont_fit_on_a_real_small_tmpfs(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], check=True)
    try:
        chunk = mnt / "out" / "rows_0-100"
        chunk.mkdir(parents=True)
        for row in range(4):
            touch(chunk / f"data_{row}.ckpt", 256 * 1024)
        m = Monitor(
            [JobConfig(name="j", out_dir=str(mnt / "out"), rows_total=100, stall_after=60)],
            use_watchdog=False,
        )
        m.tick(force_scan=True)
        job = m.status_document()["jobs"][0]
        out_disk = next(d for d in job["disk"] if d["role"] == "output")
        assert out_disk["needed_bytes"] == 96 * 256 * 1024
        assert out_disk["free_bytes"] < 4 * 1024 * 1024 and out_disk["fits"] is False
        assert any(h["id"] == "disk-wont-fit" for h in job["hints"])
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


STORM_WRITER = """
import os, sys
d, tag, n, window = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
for i in range(n):
    fd = os.open(f"{d}/{tag}_{i}", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b"x" * 32)
    os.close(fd)
    if i >= window:
        os.unlink(f"{d}/{tag}_{i - window}")
"""


@pytest.mark.slow
def test_storm_counts_exact_with_only_overflow_triggered_scans(tmp_path):
    """Periodic scans are 10 minutes apart here: after the storm, the counts are exact because every
    lost event came with an inotify overflow, and each overflow forced a scan."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else str(tmp_path)
    d = Path(base) / f"hsmon-test-storm-{os.getpid()}"
    d.mkdir()
    m = Monitor(
        [JobConfig(name="j", dump_dir=str(d), stall_after=600)], scan_interval=600.0, tick_interval=0.2
    )
    m.start()
    try:
        n = 30_000
        writers = [
            subprocess.Popen([sys.executable, "-c", STORM_WRITER, str(d), tag, str(n), "300"])
            for tag in ("a", "b")
        ]
        for w in writers:
            assert w.wait(timeout=300) == 0
        truth = sorted(os.listdir(d))
        assert len(truth) == 600

        def exact():
            dump = m.status_document()["jobs"][0]["dump"]
            return dump["files"] == 600 and dump["bytes"] == 600 * 32 and dump

        dump = wait_until(exact, 60, interval=0.5, what="exact counts after the storm")
        overflows = m.overflows_total
        if overflows == 0:  # nothing was lost: then every event arrived
            assert dump["created_total"] == 2 * n and dump["consumed_total"] == 2 * n - 600
        else:
            assert m.scans_total >= 2  # the first scan, then at least one forced by an overflow
            assert dump["created_total"] < 2 * n  # events were really lost: only the scans made it exact
    finally:
        m.stop()
        shutil.rmtree(d, ignore_errors=True)


def test_a_done_training_has_no_time_left_even_when_its_schedule_had(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    writer = ev.EventWriter("train", path)
    tracker = ProgressTracker(str(path))
    writer.emit(ev.START, total_steps=1000)
    for step in (1, 2, 3):
        writer.emit(ev.STEP, step=step, total_steps=1000, losses=[2.0], accs=[0.5])
        time.sleep(0.05)
    tracker.poll()
    assert tracker.snapshot(time.time()).progress.eta_s > 0
    writer.emit(ev.DONE, step=3)  # a --time-limit stops it at step 3 of 1000
    tracker.poll()
    done = tracker.snapshot(time.time()).progress
    assert done.eta_s == 0
    # elapsed stops at the done event: a finished job does not keep ageing
    assert done.elapsed_s > 0
    assert tracker.snapshot(time.time() + 60).progress.elapsed_s == done.elapsed_s
    writer.close()

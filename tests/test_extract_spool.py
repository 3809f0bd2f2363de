"""`hsmon extract --spool-max`: the real command pauses (reason spool) while the rows not
yet consumed would exceed the limit, and resumes as the trainer's ledger records consumption; the
monitor reads it as an online job: paused (not stalled) however long it waits, a trainer that dies
while the spool is full paged, /metrics and `hsmon status` saying so.

The trainer's side here is the contract's other party written by the test as `hsmon train --follow
--consume` writes it (the spool contract: a ``consumed`` record appended to SPOOL/hsmon-ledger.jsonl, the
chunk's row files deleted), not a fake of the product: the products under test are the extractor
and the monitor. The trainer's process is real (killed for real with SIGKILL); the real following
trainer (`hsmon train --follow`) is driven beside the real extractor in tests/test_train_follow.py.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from extract_helpers import (  # noqa: F401 (tiny_model is a fixture)
    events_of,
    make_dataset,
    run_extract,
    start_extract,
    tiny_model,
    wait_for_event,
)

from extractor.spool_gate import SpoolGate
from extractor.writer import Progress
from hsmon.contracts import events as ev
from hsmon.contracts import layout, spool, spool_fill
from hsmon.contracts.heldout import HeldOut
from hsmon.contracts.manifest_reader import read_manifest
from hsmon.contracts.spool_fill import SpoolFill, SpoolLevel
from hsmon.contracts.units import format_bytes, parse_size
from hsmon.core.config import JobConfig
from hsmon.core.monitor import Monitor
from hsmon.core.trackers.online import OnlineTracker
from hsmon.metrics.exporter import MetricsEndpoint
from hsmon.status.cli import render
from hsmon.status_doc import online_of
from trainer.follow_setup import poll_spool
from trainer.runtime import Dist
from trainer.window import SpoolSource

pytestmark = pytest.mark.slow

OPTS = ("--chunk-size", "4", "--batch-tokens", "256")
LIMIT = 700_000  # about two chunks of this dataset's rows: the run must pause several times
STALL = 1.0  # the monitor's stall_after: the extractor waits for room longer than that


@pytest.fixture
def spool_dir(tmp_path):
    """The spool on a real tmpfs (as /dev/shm would hold it) when root can mount one, else on disk."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        yield tmp_path / "spool"
        return
    mount = tmp_path / "shm"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], check=True)
    try:
        yield mount / "spool"
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            subprocess.run(["umount", "-l", str(mount)], check=True)


def consume_complete_chunks(out: Path, consumed: set[str]) -> int:
    """As the following trainer with --consume does: for each complete chunk not consumed yet,
    delete its row files and append its ``consumed`` record (fsynced). Returns the chunks consumed."""
    records = []
    for name, chunk in read_manifest(out).chunks.items():
        if name in consumed:
            continue
        for path in (out / name).glob("data_*.ckpt"):
            path.unlink()
        records.append({"type": "consumed", "ts": time.time(), "chunk": name, "rows": chunk["rows"],
                        "bytes": chunk["bytes"]})
        consumed.add(name)
    if records:
        layout.append_jsonl(spool.ledger_path(out), records)
    return len(records)


def monitor_of(out: Path, events: Path) -> Monitor:
    return Monitor([JobConfig(name="online", kind="extract", out_dir=str(out), events=str(events),
                              stall_after=STALL)], use_watchdog=False)


def job_of(monitor: Monitor):
    monitor.tick(force_scan=True)
    (job,) = monitor.status().jobs
    return job


def start_trainer_side(out: Path) -> subprocess.Popen:
    """A trainer starts following: a real process, its ledger's start record, its start and step events."""
    trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)  # hsmon train stand-in"])
    layout.append_jsonl(spool.ledger_path(out), [{"type": "start", "ts": time.time(), "pid": trainer.pid,
                                                  "passes": 2, "consume": True, "step": 0}])
    with ev.EventWriter("train", str(spool.train_events_path(out))) as writer:
        writer.emit(ev.START, pid=trainer.pid, arch="eagle3.1")  # as trainer/follow.py's start event
        # its own ETA: an hour of steps left (the extraction's rows-left ETA is far shorter)
        writer.emit("step", step=1, loss=1.0, acc=0.1, total_steps=1000, eta_s=3600.0)
    return trainer


def check_paused_not_stalled(monitor: Monitor) -> None:
    """The extractor has waited for room three stall periods, no trainer yet: paused, not stalled."""
    job = job_of(monitor)
    assert job.state == "paused", job.reason
    assert not {h.id for h in job.hints} & {"stalled", "dead"} and "no-trainer" in {h.id for h in job.hints}
    online = online_of(job)
    assert online is not None and online.limit_bytes == LIMIT
    assert online.producer.state == "paused" and online.producer.reason.startswith("spool full: ")
    assert online.consumer.state == "starting" and online.rows_waiting == online.rows_written > 0


def check_trainer_running_then_dead(monitor: Monitor, trainer: subprocess.Popen) -> None:
    job = job_of(monitor)
    online = online_of(job)
    assert job.state == "running", job.reason
    assert (online.producer.state, online.consumer.state) == ("paused", "running")
    assert online.bottleneck.startswith("training is the bottleneck: extraction waited for spool room")
    assert online.consumer.pid == trainer.pid and online.trainer_arch == "eagle3.1"
    # the job ends when its slower side does: its ETA is the trainer's, and both sides are its processes
    assert online.consumer.eta_s == 3600.0 and job.progress.eta_s == 3600.0, (online, job.progress)
    assert online.producer.eta_s is None or online.producer.eta_s < 3600.0
    assert [(p.role, p.pid) for p in job.processes][1:] == [("trainer", trainer.pid)], job.processes
    text = render(monitor.status())  # `hsmon status`'s lines for the job
    assert "trainer at step 1 (eagle3.1)" in text
    # the labels are padded to the widest of the job's rows ("online trainer's figures" once it has some)
    assert re.search(r"online extractor +PAUSED: spool full: ", text), text
    assert re.search(r"online trainer +RUNNING: a step", text), text
    bottleneck = r"online bottleneck +training is the bottleneck: extraction waited for spool room"
    assert re.search(bottleneck, text), text
    fill = f"of 700.0 kB ({100 * online.spool_bytes / LIMIT:.0f} %); {online.rows_waiting} rows waiting"
    assert fill in text
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()
    job = job_of(monitor)  # the trainer died while the spool is full: it is paged, not the extractor
    assert job.state == "dead" and job.reason.startswith(f"trainer PID {trainer.pid} is gone")
    assert "trainer-dead" in {h.id for h in job.hints} and "the extractor waits" in job.reason
    assert online_of(job).producer.state == "paused"
    metrics = MetricsEndpoint(monitor).render().decode()
    assert f'hsmon_spool_limit_bytes{{job="online"}} {float(LIMIT)}' in metrics
    assert 'hsmon_online_side_state{job="online",side="trainer",state="dead"} 1.0' in metrics
    assert 'hsmon_online_side_state{job="online",side="extractor",state="paused"} 1.0' in metrics


def test_spool_pauses_when_full_the_monitor_reads_both_sides_and_it_resumes_as_rows_are_consumed(
        tmp_path, spool_dir, tiny_model):  # noqa: F811
    data = make_dataset(tmp_path / "d.jsonl", rows=40, seed=7, min_lines=2, max_lines=3)
    events = tmp_path / "events.jsonl"
    proc = start_extract(data, spool_dir, tiny_model, *OPTS, "--spool-max", str(LIMIT), events=events)
    consumed: set[str] = set()
    trainer = None
    try:
        pause = wait_for_event(events, lambda e: e["kind"] == "pause", proc, timeout=120)
        assert pause["reason"] == "spool" and pause["max_bytes"] == LIMIT
        assert pause["message"].startswith("spool full: ") and "waiting for the trainer" in pause["message"]
        assert spool.read_spool_limit(spool_dir) == LIMIT
        level = SpoolFill(spool_dir).poll()
        assert level.waiting_bytes + pause["need_bytes"] > LIMIT >= level.waiting_bytes
        monitor = monitor_of(spool_dir, events)
        job_of(monitor)
        time.sleep(3 * STALL)  # paused, it writes nothing while nothing is consumed
        assert SpoolFill(spool_dir).poll().row_bytes == level.row_bytes
        check_paused_not_stalled(monitor)
        trainer = start_trainer_side(spool_dir)
        check_trainer_running_then_dead(monitor, trainer)
        peak = consume_until_done(proc, spool_dir, consumed)  # the trainer resumed: it consumes
        stderr = proc.stderr.read() if proc.stderr else ""
        assert proc.returncode == 0, stderr
        layout.append_jsonl(spool.ledger_path(spool_dir), [{"type": "done", "ts": time.time(), "step": 9}])
        job = job_of(monitor)
        assert job.state == "done" and online_of(job).producer.state == "done", job.reason
        monitor.stop()
    finally:
        for p in (proc, trainer):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    kinds = [(e["kind"], e.get("reason")) for e in events_of(events)]
    assert kinds[-1] == ("done", None)
    pauses = kinds.count(("pause", "spool"))
    assert pauses >= 1 and kinds.count(("resume", "spool")) == pauses
    assert "paused (spool): spool full: " in stderr and "resumed (spool)" in stderr
    assert peak <= LIMIT and SpoolFill(spool_dir).poll().rows == 40
    assert SpoolFill(spool_dir).poll().waiting_bytes == 0
    assert not list(spool_dir.glob("rows_*/data_*.ckpt")), "every consumed row file was deleted"


def consume_until_done(proc: subprocess.Popen, out: Path, consumed: set[str]) -> int:
    """Consume complete chunks until the extractor ends, then the last ones; the peak bytes waiting."""
    fill, peak = SpoolFill(out), 0
    while proc.poll() is None:
        peak = max(peak, fill.poll().waiting_bytes)
        consume_complete_chunks(out, consumed)
        time.sleep(0.05)
    consume_complete_chunks(out, consumed)
    return peak


def test_stop_while_full_then_resume_with_a_larger_limit(tmp_path, tiny_model):  # noqa: F811
    data = make_dataset(tmp_path / "d.jsonl", rows=24, seed=8, min_lines=2, max_lines=3)
    out, events = tmp_path / "spool", tmp_path / "events.jsonl"
    proc = start_extract(data, out, tiny_model, *OPTS, "--spool-max", str(LIMIT), events=events)
    try:
        wait_for_event(events, lambda e: e["kind"] == "pause" and e["reason"] == "spool", proc, timeout=120)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143  # 128 + SIGTERM: stopped, not done
    finally:
        if proc.poll() is None:
            proc.kill()
    assert events_of(events)[-1]["kind"] == "stopped"
    written = SpoolFill(out).poll().rows
    assert 0 < written < 24
    # the spool's level, one computation for all three: stopped at a full spool, then with its
    # complete chunks consumed (a partial chunk left waiting)
    assert three_levels_agree(out, events).waiting_bytes > LIMIT // 2
    consume_complete_chunks(out, set())
    level = three_levels_agree(out, events)
    assert 0 < level.waiting_bytes < LIMIT and level.consumed_bytes > 0 and not level.full
    # a resume may change the limit: one that holds everything never pauses
    again = run_extract(data, out, tiny_model, *OPTS, "--spool-max", "1G", events=events)
    assert again.returncode == 0, again.stderr
    assert spool.read_spool_limit(out) == 1_000_000_000
    kinds = [e["kind"] for e in events_of(events)]
    assert kinds[-1] == "done" and "pause" not in kinds[kinds.index("start", 1):]
    assert SpoolFill(out).poll().rows == 24


def three_levels_agree(out: Path, events: Path) -> SpoolLevel:
    """The level the extractor's gate reads (SpoolFill), the following trainer's (its spool source
    and the consumed chunks it admits, as trainer/follow.py does) and the monitor's online section
    are the same figures. Returns the extractor's."""
    gate = SpoolFill(out).poll(limit_bytes=LIMIT)
    source = SpoolSource(out, None, HeldOut(0.0, 0))
    arrival = poll_spool(Dist(), source, False)
    consumed = spool.read_ledger(out).consumed_chunks
    mine = [c for c in arrival.chunks if c.name in consumed]
    trainer = spool_fill.level(arrival.row_bytes, arrival.rows, sum(c.train_bytes for c in mine),
                               sum(len(c.train) for c in mine), arrival.spool_limit)
    assert trainer == gate
    monitor = monitor_of(out, events)
    job = job_of(monitor)
    monitor.stop()
    online = online_of(job)
    assert online is not None and online.limit_bytes == LIMIT
    assert (online.spool_bytes, online.rows_written, online.rows_consumed) == (
        gate.waiting_bytes, gate.rows, gate.consumed_rows)
    tracker = OnlineTracker(str(out))  # the monitor's tracker, fed the job's output section
    tracker.poll(0.0)
    facts = tracker.facts(0.0, job.output, None)
    assert facts is not None and facts.spool_bytes == gate.waiting_bytes and facts.spool_full == gate.full
    return gate


def test_bad_or_too_small_spool_max_is_one_line(tmp_path, tiny_model):  # noqa: F811
    data = make_dataset(tmp_path / "d.jsonl", rows=8, seed=9)
    bad = run_extract(data, tmp_path / "a", tiny_model, "--spool-max", "lots")
    assert bad.returncode == 2 and "--spool-max" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    small = run_extract(data, tmp_path / "b", tiny_model, *OPTS, "--spool-max", "10k")
    assert small.returncode == 2 and "can fill the spool for ever" in small.stderr
    assert not (tmp_path / "b" / spool.SPOOL_NAME).exists()


def test_a_limit_that_can_deadlock_is_refused_naming_the_smallest_that_cannot(tmp_path, tiny_model):  # noqa: F811
    """The held-out rows never leave the spool: a limit over one chunk (what the check asked
    before) but under chunk + held-out rows is refused; the limit it names is accepted."""
    data = make_dataset(tmp_path / "d.jsonl", rows=60, seed=9, min_lines=2, max_lines=3)
    held = [i for i in range(60) if HeldOut.new().holds(i)]
    assert len(held) >= 2  # the default rule holds some of these rows out
    probe = run_extract(data, tmp_path / "a", tiny_model, *OPTS, "--spool-max", "1k")
    assert probe.returncode == 2, probe.stderr
    chunk = parse_size(re.search(r"up to ~([\d.]+ [kMG]?B)", probe.stderr).group(1))
    least = parse_size(re.search(r"at least ([\d.]+ [kMG]?B)", probe.stderr).group(1))
    assert f"{len(held)} held out for evaluation" in probe.stderr
    assert least >= chunk + len(held) * 60_000  # each row of this model and data is over 60 kB
    refused = run_extract(data, tmp_path / "b", tiny_model, *OPTS, "--spool-max", str(2 * chunk))
    assert refused.returncode == 2 and f"at least {format_bytes(least)}" in refused.stderr
    assert len([line for line in refused.stderr.splitlines() if "--spool-max" in line]) == 1
    ok = run_extract(data, tmp_path / "c", tiny_model, *OPTS, "--spool-max", str(least), "--dry-run")
    assert ok.returncode == 0, ok.stderr


def test_shards_sharing_a_spool_count_each_others_rows_before_their_manifests_do(tmp_path):
    """Two shards' gates on one spool: the room one shard claimed for rows it is writing (not yet
    in its manifest) is not room for the other, which waits until those rows are consumed."""
    out = tmp_path / "spool"
    out.mkdir()
    stop = threading.Event()
    with ev.EventWriter("b", path=str(tmp_path / "b.jsonl")) as events:
        first, second = (SpoolGate(out, 1000, events, Progress(), stop, 0.01, RuntimeError,
                                   layout.manifest_name((i, 2))) for i in (0, 1))
        first.wait_for_room(300)  # the first shard's row file is being written
        second.wait_for_room(300)  # 600 claimed in all: room still
        waiter = threading.Thread(target=second.wait_for_room, args=(800,))
        waiter.start()  # its batch grows to 800: 300 + 800 > 1000, paused though no manifest has a row
        wait_until(lambda: second.pause.active)
        layout.append_jsonl(out / layout.manifest_name((0, 2)), [
            {"type": "row", "row": 0, "chunk": "rows_0-1", "bytes": 300}])
        first.recorded()  # the row is in the manifest: still waiting, counted once
        level = second.fill.poll(claimed=second.claims.others(), manifests=second.claims.writers)
        assert waiter.is_alive() and level.row_bytes == 300
        layout.append_jsonl(spool.ledger_path(out), [
            {"type": "consumed", "ts": time.time(), "chunk": "rows_0-1", "rows": 1, "bytes": 300}])
        waiter.join(timeout=30)
        assert not waiter.is_alive() and not second.pause.active
        first.close()
        second.close()
    said = [(e["kind"], e.get("reason")) for e in events_of(tmp_path / "b.jsonl")]
    assert said == [("pause", "spool"), ("resume", "spool")]


def wait_until(check, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)

"""The monitor reads an online job (issue 29): a real `hsmon extract --spool-max` paused for spool
room is paused, not stalled, however long it waits; a trainer that dies while the spool is full
pages the trainer, not the extractor; /metrics carries the spool's families.

The trainer's side is a real process (killed for real with SIGKILL) whose events and ledger the
test writes as `hsmon train --follow` writes them (contract 4): the product under test is the
monitor, and the real following trainer is built on its own branch (tests/test_train_follow.py
there drives both real commands).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from extract_helpers import make_dataset, start_extract, tiny_model, wait_for_event  # noqa: F401

from hsmon.contracts import events as ev
from hsmon.contracts import layout, spool
from hsmon.core.config import JobConfig
from hsmon.core.monitor import Monitor
from hsmon.metrics.exporter import MetricsEndpoint
from hsmon.status_cli import render
from hsmon.status_doc import online_of

pytestmark = pytest.mark.slow

STALL = 1.0


def job_of(monitor: Monitor):
    monitor.tick(force_scan=True)
    (job,) = monitor.status().jobs
    return job


def test_spool_pause_is_paused_not_stalled_and_a_dead_trainer_is_paged(tmp_path, tiny_model):  # noqa: F811
    data = make_dataset(tmp_path / "d.jsonl", rows=24, seed=7, min_lines=2, max_lines=3)
    out, events = tmp_path / "spool", tmp_path / "events.jsonl"
    proc = start_extract(data, out, tiny_model, "--chunk-size", "4", "--batch-tokens", "256",
                         "--spool-max", "700000", events=events)
    trainer = None
    try:
        wait_for_event(events, lambda e: e["kind"] == "pause" and e["reason"] == "spool", proc, timeout=120)
        monitor = Monitor([JobConfig(name="online", kind="extract", out_dir=str(out), events=str(events),
                                     stall_after=STALL)], use_watchdog=False)
        job_of(monitor)
        time.sleep(3 * STALL)  # the extractor waits for room three stall periods: still paused
        job = job_of(monitor)
        assert job.state == "paused", job.reason
        assert not {h.id for h in job.hints} & {"stalled", "dead"}
        assert "no-trainer" in {h.id for h in job.hints}
        online = online_of(job)
        assert online is not None and online.limit_bytes == 700_000
        assert online.producer.state == "paused" and online.producer.reason.startswith("spool full: ")
        assert online.consumer.state == "starting" and online.rows_waiting == online.rows_written > 0

        # a trainer starts following: its process, its ledger's start record, its start and step events
        trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        layout.append_jsonl(spool.ledger_path(out), [{"type": "start", "ts": time.time(), "pid": trainer.pid,
                                                      "passes": 2, "consume": True, "step": 0}])
        with ev.EventWriter("train", str(spool.train_events_path(out))) as writer:
            writer.emit(ev.START, pid=trainer.pid)
            writer.emit("step", step=1, loss=1.0, acc=0.1)
        job = job_of(monitor)
        online = online_of(job)
        assert job.state == "running", job.reason
        assert (online.producer.state, online.consumer.state) == ("paused", "running")
        assert online.bottleneck.startswith("training is the bottleneck: extraction waited for spool room")
        assert online.consumer.pid == trainer.pid
        text = render(monitor.status())  # `hsmon status`'s lines for the job
        assert "online extractor   PAUSED: spool full: " in text
        assert "online trainer     RUNNING: a step" in text
        assert "online bottleneck  training is the bottleneck: extraction waited for spool room" in text
        fill = f"of 700.0 kB ({100 * online.spool_bytes / 700_000:.0f} %); {online.rows_waiting} rows waiting"
        assert fill in text

        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
        job = job_of(monitor)
        assert job.state == "dead" and job.reason.startswith(f"trainer PID {trainer.pid} is gone")
        assert "trainer-dead" in {h.id for h in job.hints} and "the extractor waits" in job.reason
        assert online_of(job).producer.state == "paused"

        text = MetricsEndpoint(monitor).render().decode()
        assert 'hsmon_spool_limit_bytes{job="online"} 700000.0' in text
        assert 'hsmon_online_side_state{job="online",side="trainer",state="dead"} 1.0' in text
        assert 'hsmon_online_side_state{job="online",side="extractor",state="paused"} 1.0' in text
        monitor.stop()
    finally:
        for p in (proc, trainer):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()

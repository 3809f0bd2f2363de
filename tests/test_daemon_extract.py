"""The daemon watching a real `hsmon extract` process: running, SIGSTOPped (stalled within
stall-after plus one scan interval, webhook received on loopback), SIGCONTed (running again), killed
(dead)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from daemon_helpers import Daemon, WebhookReceiver, procs, wait_until  # noqa: F401
from extract_helpers import extract_cmd, make_dataset, tiny_model  # noqa: F401

pytestmark = pytest.mark.slow

STALL = 3.0
SCAN = 0.5


def test_real_extract_running_stalled_running_dead(procs, tmp_path, tiny_model):  # noqa: F811
    data = make_dataset(tmp_path / "data.jsonl", 4000, min_lines=6, max_lines=12)
    out, events = tmp_path / "out", tmp_path / "events.jsonl"
    extract = procs.start(
        extract_cmd(data, out, tiny_model, "--batch-tokens", "256", events=events),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    hook = WebhookReceiver()
    try:
        daemon = Daemon(
            procs,
            tmp_path,
            [
                "--job",
                "extract",
                "--kind",
                "extract",
                "--events",
                str(events),
                "--out",
                str(out),
                "--stall-after",
                str(STALL),
                "--scan-interval",
                str(SCAN),
                "--notify-webhook",
                hook.url,
            ],
        )
        job = wait_until(lambda: (j := daemon.job())["state"] == "running" and j, 120, what="running")
        assert job["processes"][0]["pid"] == extract.pid and job["processes"][0]["role"] == "extractor"
        assert job["progress"]["rows_total"] == 4000 and job["progress"]["rows_done"] > 0

        os.kill(extract.pid, signal.SIGSTOP)
        frozen = time.monotonic()
        wait_until(lambda: daemon.job()["state"] == "stalled", STALL + SCAN + 10, what="stalled")
        took = time.monotonic() - frozen
        assert took <= STALL + SCAN + 1.5, f"stalled after {took:.1f}s"
        body = wait_until(lambda: [b for b in hook.bodies if b["state"] == "stalled"], 10, what="webhook")[0]
        states = [e["state"] for e in daemon.job()["recent_events"] if e["kind"] == "state"]
        # The state before stalled is running, or silent when the freeze fell between a chunk's write
        # and its progress event (work visible, no event: a clean-clone run at load 7 saw it), and the
        # webhook names the one the daemon said.
        before = states[states.index("stalled") - 1]
        assert before in ("running", "silent"), states
        assert body["job"] == "extract" and body["previous"] == before, (states, hook.bodies)

        os.kill(extract.pid, signal.SIGCONT)
        wait_until(lambda: daemon.job()["state"] == "running", 20, what="running again")
        if extract.poll() is not None:
            pytest.skip("the extraction finished before it could be killed (machine faster than expected)")
        extract.kill()
        extract.wait()
        wait_until(lambda: daemon.job()["state"] == "dead", 10, what="dead")
        wait_until(lambda: any(b["state"] == "dead" for b in hook.bodies), 10, what="dead webhook")
        daemon.stop()
    finally:
        hook.close()

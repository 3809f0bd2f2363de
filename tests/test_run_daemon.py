"""The daemon and how jobs end, with real processes and a real webhook receiver on loopback:
the original job's script run through `hsmon run` (running, then done, no false alarm), and scripts
started without it, stdout to a file (total reached, given or planned in the manifest: done;
traceback: dead; neither: exited, a warning said once)."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request

import pytest
from daemon_helpers import STORY, TESTS, Daemon, WebhookReceiver, child_env, procs, wait_until  # noqa: F401

pytestmark = pytest.mark.slow

SCAN = 0.5
WAIT_THEN = str(TESTS / "wait_then.py")
CRASH = """
import os, sys, time
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
for i in range(3):
    print(f"packed row {i}")
    time.sleep(0.1)
raise RuntimeError("row 3: server returned no hidden states")
"""


def test_story_through_hsmon_run_is_running_then_done_and_sends_no_alarm(procs, tmp_path):  # noqa: F811
    hook = WebhookReceiver()
    try:
        events, out, dump = tmp_path / "story.events.jsonl", tmp_path / "out", tmp_path / "dump"
        run = procs.start([
            sys.executable, "-m", "hsmon", "run", "--job", "story", "--events", str(events),
            "--rows-total", "40", "--heartbeat", "0.4", "--",
            sys.executable, STORY, str(dump), str(out), "--rows", "40", "--delay", "0.12",
        ])
        daemon = Daemon(procs, tmp_path, [
            "--events", str(events), "--dump-dir", str(dump), "--out", str(out), "--stall-after", "4",
            "--scan-interval", str(SCAN), "--notify-webhook", hook.url,
        ])
        seen, jobs = [], []
        while run.poll() is None or (seen and seen[-1] != "done"):
            job = daemon.job()
            seen.append(job["state"])
            jobs.append(job)
            assert len(seen) < 300, seen
            time.sleep(0.2)
        assert run.returncode == 0
        wait_until(lambda: daemon.job()["state"] == "done", 10, what="done")
        first_running = seen.index("running")
        assert "silent" not in seen[first_running:] and set(seen[first_running:]) <= {"running", "done"}, seen
        assert seen.count("running") >= 5, seen
        moving = [j["progress"] for j in jobs if j["state"] == "running" and j["progress"]["rows_done"]]
        assert moving and all(p["rows_total"] == 40 for p in moving)
        assert any(p["eta_s"] is not None and p["rows_per_s"] for p in moving), moving[-1]
        job = daemon.job()
        assert job["progress"]["rows_done"] == 40 and job["events"]["log"] == str(tmp_path / "story.log")
        assert not any(h["id"] == "stdout-buffered" for j in jobs for h in j["hints"])
        time.sleep(2 * SCAN)
        # the only message is the done one: no dead, stalled or exited on a clean run
        assert [b["state"] for b in hook.bodies] == ["done"] and hook.bodies[0]["severity"] == "info"
        daemon.stop()
    finally:
        hook.close()


def start_external(procs, tmp_path, name, argv):  # noqa: F811
    """A job started as the original job's user did: `python SCRIPT > LOG 2>&1`, no -u, no hsmon run.
    It waits for tmp_path/go before it works, so that the daemon sees it alive first."""
    log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115
    return procs.start([sys.executable, WAIT_THEN, str(tmp_path / "go"), *argv], stdout=log,
                       stderr=subprocess.STDOUT)


def test_external_endings_done_dead_exited_and_one_warning(procs, tmp_path):  # noqa: F811
    hook = WebhookReceiver()
    try:
        (tmp_path / "crash.py").write_text(CRASH)
        opts = ["--delay", "0.02", "--chunk-size", "10", "--rows"]
        t = tmp_path
        full = start_external(procs, t, "full", [STORY, f"{t}/d1", f"{t}/o1", *opts, "20"])
        crash = start_external(procs, tmp_path, "crash", [str(tmp_path / "crash.py"), str(tmp_path / "o2")])
        quiet = start_external(procs, t, "quiet", [STORY, f"{t}/d3", f"{t}/o3", *opts, "10"])
        planned = start_external(procs, t, "planned", [STORY, f"{t}/d4", f"{t}/o4", "--manifest", "--plan",
                                                       *opts, "10"])
        cfg = tmp_path / "hsmon.toml"
        cfg.write_text(f"""
[daemon]
scan_interval = {SCAN}
notify_webhook = "{hook.url}"
notify_repeat = 1

[[job]]
name = "full"
out_dir = "{tmp_path / "o1"}"
pid = {full.pid}
rows_total = 20
stall_after = 30

[[job]]
name = "crash"
pid = {crash.pid}
stall_after = 30

[[job]]
name = "planned"
out_dir = "{tmp_path / "o4"}"
pid = {planned.pid}
stall_after = 30

[[job]]
name = "quiet"
out_dir = "{tmp_path / "o3"}"
pid = {quiet.pid}
stall_after = 30
""")
        daemon = Daemon(procs, tmp_path, ["--config", str(cfg)])
        names = ("full", "crash", "quiet", "planned")
        wait_until(lambda: all(daemon.job(n)["processes"][0]["alive"] for n in names), 15, what="all alive")
        (tmp_path / "go").touch()
        for proc in (full, crash, quiet, planned):
            proc.wait(timeout=60)
        assert (full.returncode, crash.returncode, quiet.returncode, planned.returncode) == (0, 1, 0, 0)

        done = wait_until(lambda: (j := daemon.job("full"))["state"] == "done" and j, 10, what="full done")
        assert "20 of 20" in done["reason"] and done["progress"]["rows_done"] == 20

        # the plan an hsmon manifest carries is the expected total
        done = wait_until(lambda: (j := daemon.job("planned"))["state"] == "done" and j, 10, what="planned")
        assert "10 of 10" in done["reason"] and done["output"]["layout"] == "hsmon"

        dead = wait_until(lambda: (j := daemon.job("crash"))["state"] == "dead" and j, 10, what="crash dead")
        line = "RuntimeError: row 3: server returned no hidden states"
        assert line in dead["reason"]
        hint = next(h for h in dead["hints"] if h["id"] == "dead")
        assert hint["severity"] == "critical" and line in hint["message"] and "crash.log" in hint["message"]

        exited = wait_until(lambda: (j := daemon.job("quiet"))["state"] == "exited" and j, 10, what="exited")
        hint = next(h for h in exited["hints"] if h["id"] == "exited")
        assert hint["severity"] == "warning" and "quiet.log" in hint["message"]
        assert "10 rows" in hint["message"]
        assert not [h for h in exited["hints"] if h["severity"] == "critical"]
        time.sleep(3)  # three repeat intervals: a critical state would be repeated, the warning is not
        by_job = {n: [b for b in hook.bodies if b["job"] == n] for n in names}
        assert [(b["state"], b["severity"]) for b in by_job["quiet"]] == [("exited", "warning")]
        assert [b["state"] for b in by_job["full"]][:1] == ["done"]
        assert by_job["crash"] and all(b["state"] == "dead" for b in by_job["crash"])
        metrics = urllib.request.urlopen(daemon.url + "/metrics", timeout=10).read().decode()
        assert 'hsmon_job_state{job="quiet",state="exited"} 1.0' in metrics
        assert 'hsmon_job_state{job="crash",state="dead"} 1.0' in metrics
        status = subprocess.run([sys.executable, "-m", "hsmon", "status", "--url", daemon.url],
                                env=child_env(), capture_output=True, text=True, timeout=60)
        assert "EXITED" in status.stdout and status.returncode == 1  # crash is dead
        daemon.stop()
    finally:
        hook.close()

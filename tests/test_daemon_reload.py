"""`systemctl reload hsmon-daemon` (SIGHUP): jobs come and go without a restart. A real daemon, a
real signal; the plan itself as a pure function."""

from __future__ import annotations

import os
import signal
import time
import urllib.request

from daemon_helpers import Daemon, procs, wait_until  # noqa: F401 (procs is a fixture)

from hsmon.core.config import JobConfig
from hsmon.core.monitor import Monitor
from hsmon.core.reload import finished_launched, plan_reload


def config_text(tmp_path, names: list[str], grace: float = 2.0, extra: str = "") -> str:
    jobs = "".join(f'\n[[job]]\nname = "{n}"\nout_dir = "{tmp_path / n}"\nstall_after = 60\n' for n in names)
    return f"[daemon]\nscan_interval = 0.5\nretire_grace = {grace}\n{extra}{jobs}"


def test_plan_reload_adds_removes_changes_and_keeps():
    a, b, c = (JobConfig(name=n, out_dir=f"/o/{n}") for n in "abc")
    b2 = JobConfig(name="b", out_dir="/o/b", stall_after=30)
    plan = plan_reload({"a": a, "b": b, "c": c}, [JobConfig(name="c", out_dir="/o/c"), b2,
                                                   JobConfig(name="d", out_dir="/o/d")])
    assert [j.name for j in plan.add] == ["d"] and plan.remove == ["a"]
    assert [j.name for j in plan.change] == ["b"] and plan.keep == ["c"]
    assert plan.summary() == "added d; removed a; changed b; kept c"


def test_finished_launched_jobs_go_after_the_grace_only():
    class S:
        def __init__(self, job, state, since):
            self.job, self.state, self.state_since_ts = job, state, since

    statuses = [S("train-x", "done", 100.0), S("train-y", "done", 190.0), S("train-z", "running", 0.0),
                S("configured", "done", 0.0), S("removed", "done", 0.0)]
    watched = {"train-x", "train-y", "train-z", "configured"}  # "removed": retired by a reload, held
    assert finished_launched(statuses, {"configured"}, watched, now=200.0, grace_s=60.0) == ["train-x"]


def test_removing_a_job_not_watched_leaves_the_rendered_metrics_valid(tmp_path):
    """/metrics is rendered for a (ticks, jobs generation) key; a removal that removed nothing must
    not move the generation, or every scrape until the next tick renders itself (~10 ms at 20 jobs)."""
    monitor = Monitor([JobConfig(name="a", out_dir=str(tmp_path))], use_watchdog=False)
    generation = monitor.jobs_generation
    assert monitor.remove_job("not-watched") is False and monitor.jobs_generation == generation
    assert monitor.remove_job("a") is True and monitor.jobs_generation == generation + 1


def test_a_job_a_reload_removed_after_it_ended_is_retired_once(procs, tmp_path):  # noqa: F811
    """A configured job that ended more than the grace ago, then removed by a reload: held for its
    grace and gone, never taken for a finished launched training (the 60-minute soak found the
    daemon "retiring" such jobs at every tick until their grace ended, each time moving the jobs'
    generation, so that every scrape in between rendered /metrics itself)."""
    (tmp_path / "b").mkdir()
    events = tmp_path / "a.jsonl"
    events.write_text("".join(f'{{"v": 1, "ts": {time.time()}, "job": "a", "kind": "{k}"}}\n'
                              for k in ("start", "done")))
    cfg = tmp_path / "hsmon.toml"
    cfg.write_text(config_text(tmp_path, ["b"]) + f'\n[[job]]\nname = "a"\nevents = "{events}"\n')
    daemon = Daemon(procs, tmp_path, ["--config", str(cfg)])

    def jobs() -> dict[str, dict]:
        return {j["job"]: j for j in daemon.status()["jobs"]}

    done = wait_until(lambda: jobs().get("a", {}).get("state") == "done" and jobs()["a"], what="a done")
    wait_until(lambda: time.time() - done["state_since_ts"] > 2.5, what="a done for longer than the grace")
    cfg.write_text(config_text(tmp_path, ["b"]))
    daemon.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "removed a" in daemon.stderr_path.read_text(), what="the reload")
    assert "a" in jobs()  # held for its grace from the reload
    wait_until(lambda: "a" not in jobs(), timeout=30, what="a gone after its grace")
    assert "retired job a" not in daemon.stderr_path.read_text()


def test_sighup_adds_and_retires_jobs_keeps_the_others_and_refuses_a_bad_file(procs, tmp_path):  # noqa: F811
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    cfg = tmp_path / "hsmon.toml"
    cfg.write_text(config_text(tmp_path, ["a", "b"]))
    daemon = Daemon(procs, tmp_path, ["--config", str(cfg)])

    def jobs() -> dict[str, dict]:
        return {j["job"]: j for j in daemon.status()["jobs"]}

    wait_until(lambda: daemon.status()["daemon"]["ticks_total"] >= 2, what="two ticks")
    before = jobs()
    cfg.write_text(config_text(tmp_path, ["b", "c"]))
    daemon.proc.send_signal(signal.SIGHUP)
    after = wait_until(lambda: "c" in (j := jobs()) and j, what="c added")
    assert "a" in after  # retired: its last status stays readable for the grace period
    assert after["b"]["state_since_ts"] == before["b"]["state_since_ts"]  # kept, not restarted
    assert after["b"]["transitions_total"] == before["b"]["transitions_total"]

    def metrics() -> str:
        with urllib.request.urlopen(daemon.url + "/metrics", timeout=10) as resp:
            return resp.read().decode()

    assert 'job="a"' in metrics()
    wait_until(lambda: "a" not in jobs(), timeout=30, what="a gone after its grace")
    assert 'job="a"' not in metrics() and 'job="c"' in metrics()

    cfg.write_text(config_text(tmp_path, ["c"], extra="bogus = 1\n"))
    daemon.proc.send_signal(signal.SIGHUP)
    log = wait_until(lambda: "reload refused" in (t := daemon.stderr_path.read_text()) and t, what="refusal")
    refusal = next(line for line in log.splitlines() if "reload refused" in line)
    assert "bogus" in refusal and "the 2 jobs watched go on unchanged" in refusal
    assert set(jobs()) == {"b", "c"} and daemon.proc.poll() is None
    assert "reloaded in " in log and "added c; removed a; kept b" in log


def test_a_new_jobs_starting_clock_does_not_move_at_its_first_tick(tmp_path):
    """A job is shown `starting` from the moment it is added (before any tick measured it); its first
    tick deciding `starting` keeps that clock (the soak saw it move 0.6 s: a state clock reset)."""
    monitor = Monitor([JobConfig(name="new", events=str(tmp_path / "new.jsonl"), stall_after=60)],
                      use_watchdog=False)
    before = monitor.status_document()["jobs"][0]
    assert before["state"] == "starting"
    time.sleep(0.2)
    monitor.tick(force_scan=True)
    after = monitor.status_document()["jobs"][0]
    assert after["state"] == "starting" and after["state_since_ts"] == before["state_since_ts"]
    assert after["state_history"][-1]["ts"] == before["state_since_ts"]


def test_a_burst_of_sighups_leaves_the_daemon_answering(procs, tmp_path):  # noqa: F811
    """SIGHUPs that come while the last one's handler runs (`systemctl reload` twice, a config tool)
    must not hang the daemon: its handler took the reload Event's lock, and a second signal handled
    inside it waited for that lock on the same thread for ever (the HTTP server, on that thread,
    stopped answering; found by a churn of 300 reloads)."""
    (tmp_path / "a").mkdir()
    cfg = tmp_path / "hsmon.toml"
    cfg.write_text(config_text(tmp_path, ["a"]))
    daemon = Daemon(procs, tmp_path, ["--config", str(cfg)])
    wait_until(lambda: daemon.status()["daemon"]["ticks_total"] >= 1, what="a tick")
    end = time.monotonic() + 3.0
    while time.monotonic() < end:  # spread over 3 s, so that some come while a handler runs
        os.kill(daemon.proc.pid, signal.SIGHUP)
        time.sleep(0.0002)
    with urllib.request.urlopen(daemon.url + "/metrics", timeout=10) as resp:
        assert resp.status == 200
    wait_until(lambda: "reloaded in " in daemon.stderr_path.read_text(), what="a reload logged")
    daemon.stop()
    assert daemon.proc.returncode == 0

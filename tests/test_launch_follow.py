"""The training launch's follow option: the TUI form and the daemon's POST /api/v1/train
start `hsmon train DATA --follow --passes E [--consume]` on a running extraction, its events in
the spool where the monitor reads the online job's trainer (the spool contract)."""

from __future__ import annotations

import contextlib
import os
import sys

from daemon_helpers import STANDIN_TRAIN, Daemon, child_env, post_json, procs, wait_until  # noqa: F401

from hsmon.contracts import events as ev
from hsmon.contracts import layout, spool
from hsmon.launch.training import training_argv, validate_training_request

STANDIN = f"{sys.executable} {STANDIN_TRAIN}"


def spool_dir(tmp_path):
    out = tmp_path / "spool"
    out.mkdir()
    layout.append_jsonl(out / layout.MANIFEST_NAME, [{"type": "run"}])
    spool.write_spool_limit(out, 20_000_000)
    return out


def test_follow_passes_and_consume_reach_the_trainer_and_its_events_go_to_the_spool(tmp_path):
    data = spool_dir(tmp_path)
    req, errors = validate_training_request({"data_dir": str(data), "out_dir": str(tmp_path / "d"),
                                             "follow": "yes", "passes": "2", "consume": "yes"})
    assert errors == {} and req is not None and req.follow and req.consume and req.passes == 2
    argv = training_argv(req, python="/usr/bin/python3")
    assert argv[argv.index("--events") + 1] == str(spool.train_events_path(data))
    assert argv[-4:] == ["--follow", "--passes", "2", "--consume"]
    plain, _ = validate_training_request({"data_dir": str(data), "out_dir": str(tmp_path / "d"),
                                          "follow": "no", "passes": "", "consume": ""})
    assert plain is not None and "--follow" not in training_argv(plain, python="/usr/bin/python3")
    assert plain.events_path == str(tmp_path / "d" / "events.jsonl")


def test_follow_fields_are_checked_and_named(tmp_path):
    data = spool_dir(tmp_path)
    base = {"data_dir": str(data), "out_dir": str(tmp_path / "d")}
    _, errors = validate_training_request({**base, "follow": "maybe"})
    assert errors == {"follow": "follow must be yes or no (got 'maybe')"}
    _, errors = validate_training_request({**base, "passes": "3", "consume": "yes"})
    assert set(errors) == {"passes", "consume"} and "set follow to yes" in errors["passes"]
    _, errors = validate_training_request({**base, "follow": True, "passes": "0"})
    assert errors == {"passes": "passes must be at least 1 and at most 1000 (got 0)"}


def test_the_daemon_launches_a_following_training_and_reads_it_as_the_online_jobs_trainer(procs, tmp_path):  # noqa: F811
    """POST /api/v1/train with follow: the trainer (the launch tests' stand-in, which writes events
    to --events) is started with --follow --passes E --consume, its events land in the spool, and
    the daemon's extraction job of that spool shows it as its trainer side."""
    data = spool_dir(tmp_path)
    ext_events = tmp_path / "extract-events.jsonl"
    with ev.EventWriter("extract", str(ext_events)) as writer:
        writer.emit(ev.START, pid=os.getpid(), rows_total=100, out_dir=str(data))
    token = "a-long-enough-control-token"
    (tmp_path / "token").write_text(token)
    (tmp_path / "token").chmod(0o600)
    daemon = Daemon(procs, tmp_path, ["--out", str(data), "--events", str(ext_events), "--control-token-file",
                                      str(tmp_path / "token"), "--scan-interval", "0.5"],
                    env=child_env(HSMON_TRAIN_COMMAND=STANDIN))
    fields = {"data_dir": str(data), "out_dir": str(tmp_path / "drafter"), "follow": True, "passes": 2,
              "consume": True}
    code, body = post_json(daemon.url + "/api/v1/train", fields, token=token)
    assert code == 201, body
    try:
        assert body["argv"][-4:] == ["--follow", "--passes", "2", "--consume"] and body["warning"] is None
        assert body["events"] == str(spool.train_events_path(data))
        def trainer_seen() -> dict | None:
            (job,) = [j for j in daemon.status()["jobs"] if j["job"] != body["job"]]  # the extraction's
            online = job.get("online")
            return online if online and online["consumer"]["pid"] == body["pid"] else None

        online = wait_until(trainer_seen, 20, what="the trainer in the extraction's online section")
        assert online["limit_bytes"] == 20_000_000 and online["consumer"]["state"] in ("running", "starting")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(body["pid"], 9)
    daemon.stop()

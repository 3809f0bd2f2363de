"""hsmon.launch.training and the daemon's token-gated control endpoints. `hsmon train` is built on another
branch: launches here run tests/standin_train.py (a stand-in, named as such) through
HSMON_TRAIN_COMMAND."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from daemon_helpers import STANDIN_TRAIN, STORY, Daemon, child_env, post_json, procs, wait_until  # noqa: F401
from extract_helpers import tiny_model  # noqa: F401

from hsmon.contracts import events as ev
from hsmon.launch.training import complete_chunks_warning, training_argv, validate_training_request

STANDIN = f"{sys.executable} {STANDIN_TRAIN}"


@pytest.fixture
def data_dir(tmp_path) -> Path:
    """A finished extraction (hsmon layout) made by a real run of the original job's script."""
    out = tmp_path / "data"
    subprocess.run(
        [
            sys.executable,
            STORY,
            str(tmp_path / "dump"),
            str(out),
            "--rows",
            "20",
            "--delay",
            "0",
            "--chunk-size",
            "10",
            "--manifest",
        ],
        env=child_env(),
        check=True,
        stdout=subprocess.DEVNULL,
        timeout=60,
    )
    return out


def test_validation_errors_name_the_field(tmp_path, data_dir):
    req, errors = validate_training_request({})
    assert req is None and {"data_dir", "out_dir"} <= set(errors)
    (tmp_path / "empty").mkdir()
    (tmp_path / "afile").write_text("x")
    req, errors = validate_training_request(
        {
            "data_dir": str(tmp_path / "empty"),
            "out_dir": str(tmp_path / "afile"),
            "epochs": "two",
            "lr": "-1",
            "ttt_length": 0,
            "gpus": 1.5,
            "arch": "eagle4",
            "target_model": str(tmp_path / "no-model"),
            "colour": "red",
        }
    )
    assert req is None
    assert "no extraction output" in errors["data_dir"]
    assert "not a directory" in errors["out_dir"]
    assert "whole number" in errors["epochs"] and "at least" in errors["lr"]
    assert "ttt_length" in errors["ttt_length"] and "gpus" in errors
    assert "embedded default" in errors["target_model"] and "colour" in errors["_"]
    assert errors["arch"] == "arch must be one of eagle3, eagle3.1 (got 'eagle4'); empty: eagle3.1"
    req, errors = validate_training_request({"data_dir": str(data_dir), "out_dir": str(data_dir / "drafter")})
    assert req is None and "inside data_dir" in errors["out_dir"]
    req, errors = validate_training_request(
        {"data_dir": str(tmp_path / "nope"), "out_dir": str(tmp_path / "o")}
    )
    assert "not an existing directory" in errors["data_dir"]


def test_valid_request_and_argv(tmp_path, data_dir):
    req, errors = validate_training_request(
        {
            "data_dir": str(data_dir),
            "out_dir": str(tmp_path / "drafter"),
            "epochs": "3",
            "lr": "3e-4",
            "batch_tokens": 4096,
            "gpus": "",
        }
    )
    assert errors == {} and req is not None
    argv = training_argv(req)
    assert argv[:5] == [sys.executable, "-m", "hsmon", "train", str(data_dir)]
    assert argv[argv.index("--out") + 1] == str(tmp_path / "drafter")
    assert argv[argv.index("--events") + 1] == str(tmp_path / "drafter" / "events.jsonl")
    assert argv[argv.index("--epochs") + 1] == "3" and argv[argv.index("--lr") + 1] == "0.0003"
    assert "--target-model" not in argv and "--ttt-length" not in argv
    assert "--time-limit" not in argv and "--threads" not in argv and "--arch" not in argv
    req.arch = "eagle3.1"
    assert training_argv(req)[-2:] == ["--arch", "eagle3.1"]
    req.gpus = 4
    argv = training_argv(req)
    assert "torchrun" in " ".join(argv[:3]) or "torch.distributed.run" in argv
    i = argv.index("--nproc-per-node")
    assert argv[i + 1] == "4" and argv[i + 2 : i + 6] == ["-m", "hsmon", "train", str(data_dir)]


def test_time_limit_and_threads_reach_the_trainer(tmp_path, data_dir):
    """The demo's short training: a time budget and one torch thread, through the launch fields."""
    fields = {"data_dir": str(data_dir), "out_dir": str(tmp_path / "drafter")}
    req, errors = validate_training_request({**fields, "time_limit": "75", "threads": 1})
    assert errors == {} and req is not None and req.time_limit == 75.0 and req.threads == 1
    argv = training_argv(req)
    assert argv[argv.index("--time-limit") + 1] == "75.0" and argv[argv.index("--threads") + 1] == "1"
    req, errors = validate_training_request({**fields, "time_limit": "0.5", "threads": "two"})
    assert req is None and "time_limit" in errors["time_limit"] and "whole number" in errors["threads"]


def test_target_model_takes_a_preset_name(tmp_path, data_dir, monkeypatch):
    """`smollm2` reaches `hsmon train --target-model` as a name (the trainer makes the preset);
    a name that is neither a preset nor a directory is refused, naming the presets."""
    monkeypatch.chdir(tmp_path)  # no directory called smollm2 here
    fields = {"data_dir": str(data_dir), "out_dir": str(tmp_path / "drafter")}
    req, errors = validate_training_request({**fields, "target_model": "smollm2"})
    assert errors == {} and req is not None and req.target_model == "smollm2"
    argv = training_argv(req)
    assert argv[argv.index("--target-model") + 1] == "smollm2"
    req, errors = validate_training_request({**fields, "target_model": "nosuch"})
    from hsmon.contracts.presets import PRESETS

    assert req is None and f"nor a preset ({', '.join(PRESETS)})" in errors["target_model"]
    assert "tiny-deepseek-v3" in errors["target_model"]  # every preset, not a list written by hand


def test_complete_chunks_warning(tmp_path, data_dir):
    assert complete_chunks_warning(data_dir) is None
    unfinished = tmp_path / "unfinished"
    subprocess.run(
        [
            sys.executable,
            STORY,
            str(tmp_path / "d2"),
            str(unfinished),
            "--rows",
            "15",
            "--delay",
            "0",
            "--chunk-size",
            "10",
            "--manifest",
            "--events",
            str(tmp_path / "x.jsonl"),
        ],
        env=child_env(),
        check=True,
        stdout=subprocess.DEVNULL,
        timeout=60,
    )
    warning = complete_chunks_warning(unfinished)
    assert warning and "rows_10-20" in warning and "complete chunks only (10 rows)" in warning
    with ev.EventWriter("x", data_dir / "events.jsonl") as w:
        w.emit(ev.START, rows_total=40)
    assert "no 'done'" in complete_chunks_warning(data_dir)


def test_launch_is_detached_survives_its_parent_and_stops_gracefully(tmp_path, data_dir):
    out = tmp_path / "drafter"
    launcher = (
        "import json, sys\n"
        "from hsmon.launch.training import validate_training_request, launch_training\n"
        f"req, err = validate_training_request({{'data_dir': {str(data_dir)!r}, 'out_dir': {str(out)!r}}})\n"
        "print(json.dumps(launch_training(req).as_dict()))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", launcher],
        env=child_env(HSMON_TRAIN_COMMAND=STANDIN),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    job = json.loads(res.stdout)  # the launcher has exited by now
    pid = job["pid"]
    try:
        assert os.getsid(pid) == pid  # its own session: no terminal hang-up reaches it
        assert job["events"] == str(out / "events.jsonl") and (out / "train.log").exists()
        assert (out / "train.pid").read_text().strip() == str(pid)
        wait_until(
            lambda: (
                (out / "events.jsonl").exists()
                and any(e["kind"] == "step" for e in ev.iter_events(out / "events.jsonl"))
            ),
            20,
            what="step events",
        )
        from hsmon.launch.training import stop_job

        assert stop_job(pid)
        wait_until(
            lambda: any(e["kind"] == "stopped" for e in ev.iter_events(out / "events.jsonl")),
            20,
            what="stopped event",
        )
        kinds = [e["kind"] for e in ev.iter_events(out / "events.jsonl")]
        assert kinds[-2:] == ["checkpoint", "stopped"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)


@pytest.mark.slow
def test_control_endpoints_off_by_default_token_checked_launch_and_stop(procs, tmp_path, data_dir):  # noqa: F811
    plain = Daemon(procs, tmp_path, ["--events", str(tmp_path / "none.jsonl")])
    code, body = post_json(plain.url + "/api/v1/train", {"data_dir": str(data_dir)})
    assert code == 403 and "--control-token-file" in body["error"]
    plain.stop()

    token = "s3cret-token-0123456789"
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)  # the daemon refuses a token others may read
    daemon = Daemon(
        procs,
        tmp_path,
        ["--control-token-file", str(token_file), "--scan-interval", "0.5"],
        env=child_env(HSMON_TRAIN_COMMAND=STANDIN),
    )
    out = tmp_path / "drafter"
    fields = {"data_dir": str(data_dir), "out_dir": str(out), "epochs": 1}
    assert post_json(daemon.url + "/api/v1/train", fields)[0] == 401
    assert post_json(daemon.url + "/api/v1/train", fields, token="wrong-token-wrong-token")[0] == 401
    code, body = post_json(
        daemon.url + "/api/v1/train", {"data_dir": str(tmp_path), "out_dir": ""}, token=token
    )
    assert code == 400 and set(body["errors"]) == {"data_dir", "out_dir"}

    code, body = post_json(daemon.url + "/api/v1/train", fields, token=token)
    assert code == 201, body
    pid, name = body["pid"], body["job"]
    try:
        job = wait_until(
            lambda: (j := daemon.job(name))["state"] == "running" and j, 20, what="training running"
        )
        assert job["kind"] == "train" and job["training"]["step"] >= 1
        assert job["processes"][0]["pid"] == pid and job["processes"][0]["role"] == "trainer"
        code, _again = post_json(daemon.url + "/api/v1/train", fields, token=token)
        assert code == 409
        code, stopped = post_json(daemon.url + f"/api/v1/jobs/{name}/stop", {}, token=token)
        assert code == 202 and stopped["pid"] == pid
        wait_until(lambda: daemon.job(name)["state"] == "stopped", 20, what="stopped after stop")
        assert "stopped on request" in daemon.job(name)["reason"]
        assert post_json(daemon.url + "/api/v1/jobs/nope/stop", {}, token=token)[0] == 404
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    daemon.stop()


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("trainer.cli") is None, reason="hsmon train is not in this build yet"
)
def test_daemon_launches_and_stops_a_real_hsmon_train(procs, tmp_path, tiny_model):  # noqa: F811
    """The whole control path with the real trainer: extract with a real hsmon extract, launch
    `hsmon train` through POST /api/v1/train, watch it run, stop it (checkpoint, then exit)."""
    from extract_helpers import extract_cmd, make_dataset

    data = make_dataset(tmp_path / "data.jsonl", 60)
    out = tmp_path / "extracted"
    subprocess.run(
        extract_cmd(data, out, tiny_model),
        env=child_env(),
        check=True,
        timeout=300,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    token = "a-long-enough-control-token"
    (tmp_path / "token").write_text(token)
    (tmp_path / "token").chmod(0o600)
    env = child_env()
    env.pop("HSMON_TRAIN_COMMAND", None)
    daemon = Daemon(
        procs, tmp_path, ["--control-token-file", str(tmp_path / "token"), "--scan-interval", "0.5"], env=env
    )
    fields = {
        "data_dir": str(out),
        "out_dir": str(tmp_path / "drafter"),
        "target_model": str(tiny_model),
        "epochs": 50,
        "batch_tokens": 256,
    }
    code, body = post_json(daemon.url + "/api/v1/train", fields, token=token)
    assert code == 201, body
    assert body["argv"][1:4] == ["-m", "hsmon", "train"]
    pid, name = body["pid"], body["job"]
    try:
        job = wait_until(
            lambda: (j := daemon.job(name))["state"] in ("running", "dead", "done", "stopped") and j,
            240,
            interval=0.5,
            what="training running",
        )
        assert job["state"] == "running", (
            job["reason"],
            (tmp_path / "drafter" / "train.log").read_text()[-2000:],
        )
        assert job["training"]["step"] >= 1 and isinstance(job["training"]["loss"], list)
        code, _ = post_json(daemon.url + f"/api/v1/jobs/{name}/stop", {}, token=token)
        assert code == 202
        job = wait_until(
            lambda: (j := daemon.job(name))["state"] in ("done", "stopped", "dead") and j, 120, what="stopped"
        )
        # stopped from the TUI's path (the control API) long before its 50 epochs: never done
        assert job["state"] == "stopped" and "stopped on request (SIGTERM)" in job["reason"], job["reason"]
        step, total = job["training"]["step"], job["training"]["total_steps"]
        # launched through the API (the dashboard's form): its Resume, never a command nobody typed
        resume = f"at step {step} of {total}: Resume (the dashboard's training form, or resume: yes in"
        assert resume in job["reason"] and "hsmon train" not in job["reason"], job["reason"]
        assert step < total and job["training"]["eta_s"] is None and not (job["progress"] or {}).get("eta_s")
        assert job["training"]["last_checkpoint"]
        # its log, named by its start event: what the dashboard's Logs view (l) tails
        assert job["logs"][0]["path"] == str(tmp_path / "drafter" / "train.log"), job.get("logs")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    daemon.stop()


def test_in_process_launch_watches_refuses_a_second_and_stops(tmp_path, data_dir, monkeypatch):
    # The TUI's in-process form and the daemon's endpoint share hsmon.launch.watch: the launched
    # training becomes a watched job, a second launch into the same directory is refused while
    # the first runs, and a stop reaches its process.
    from hsmon.core.monitor import Monitor
    from hsmon.launch.watch import launch_and_watch, stop_watched

    monkeypatch.setenv("HSMON_TRAIN_COMMAND", STANDIN)
    monitor = Monitor([], source="inprocess")
    fields = {"data_dir": str(data_dir), "out_dir": str(tmp_path / "drafter")}
    bad = launch_and_watch(monitor, {**fields, "epochs": "many"})
    assert bad.job is None and "epochs" in bad.errors and monitor.job_names() == []
    first = launch_and_watch(monitor, fields)
    assert first.job is not None and first.warning is None
    try:
        cfg = monitor.job_config(first.job.job)
        assert cfg is not None and (cfg.kind, cfg.pid) == ("train", first.job.pid)
        assert cfg.events == first.job.events
        second = launch_and_watch(monitor, fields)
        assert second.job is None and second.conflict and str(tmp_path / "drafter") in second.conflict
        none = stop_watched(monitor, "no-such-job")
        assert none == (None, f"no job named 'no-such-job'; jobs: {first.job.job}")
        pid, error = stop_watched(monitor, first.job.job)
        assert (pid, error) == (first.job.pid, None)
        wait_until(lambda: monitor.job_pid(first.job.job) is None, 30, what="the stopped training gone")
        again = launch_and_watch(monitor, fields)  # the finished job is replaced, not refused
        assert again.job is not None and again.job.pid != first.job.pid
        assert monitor.job_names().count(again.job.job) == 1
        stop_watched(monitor, again.job.job)
    finally:
        launched = [first, locals().get("second"), locals().get("again")]
        for job in (outcome.job for outcome in launched if outcome is not None):
            if job is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(job.pid, 9)
        monitor.stop()


def test_the_dashboards_in_process_source_launches_and_stops_through_the_daemons_path(tmp_path, data_dir,
                                                                                     monkeypatch):
    # hsmon tui without a daemon: its form and its stop key go through hsmon.launch.watch, as the
    # daemon's endpoints do; a second launch is refused while the first runs.
    from hsmon.tui.sources import InProcessSource

    monkeypatch.setenv("HSMON_TRAIN_COMMAND", STANDIN)
    source = InProcessSource([], interval=0.1)
    fields = {"data_dir": str(data_dir), "out_dir": str(tmp_path / "drafter")}
    first = source.launch_training(fields)
    pid = None
    try:
        assert first.ok and first.job == "train-drafter", first.message
        pid = source.monitor.job_pid("train-drafter")
        assert pid is not None and f"pid {pid}" in first.message
        again = source.launch_training(fields)
        assert not again.ok and str(tmp_path / "drafter") in again.message
        (job,) = source.monitor.status().jobs
        stopped = source.stop_job(job)
        assert stopped.ok and f"pid {pid}" in stopped.message, stopped.message
        wait_until(lambda: source.monitor.job_pid("train-drafter") is None, 30, what="the training stopped")
        gone = source.stop_job(job)
        assert not gone.ok and "no live process" in gone.message, gone.message
    finally:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        source.monitor.stop()

"""One launch at a time, against a real daemon with a control token: two launches
into one directory at once start one training and answer the other 409 (neither connection
dropped); two directories of the same last name are two jobs. Trainings are the stand-in
tests/standin_train.py (HSMON_TRAIN_COMMAND), which runs until stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from pathlib import Path

import pytest
from daemon_helpers import STANDIN_TRAIN, Daemon, Procs, child_env, post_json, wait_until

from hsmon.contracts import events as ev

TOKEN = "0123456789abcdef-once-token"


def slow_extraction_output(where: Path, heartbeats: int) -> Path:
    """An extraction output whose events the launch reads whole before it starts the training (the
    unfinished-extraction warning): a long events file keeps the daemon between its check and its
    launch for a second or so, on any machine."""
    where.mkdir(parents=True)
    (where / "hsmon-manifest.jsonl").write_text("")
    beat = ev.encode_event(ev.make_event("heartbeat", "x", rows=1))
    (where / "events.jsonl").write_text(ev.encode_event(ev.make_event(ev.START, "x")) + beat * heartbeats)
    return where


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    base = tmp_path_factory.mktemp("once")
    root = base / "root"
    slow_extraction_output(root / "data", 400_000)
    token = base / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    procs = Procs()
    daemon = Daemon(procs, base, ["--control-token-file", str(token), "--allow-root", str(root)],
                    env=child_env(HSMON_TRAIN_COMMAND=f"{sys.executable} {STANDIN_TRAIN}"))
    started: list[int] = []
    yield root, daemon, started
    for pid in started:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    procs.close()


def train(daemon: Daemon, out: Path, data: Path) -> tuple[int, dict]:
    return post_json(daemon.url + "/api/v1/train", {"data_dir": str(data), "out_dir": str(out)}, token=TOKEN,
                     timeout=60)


def test_two_launches_at_once_into_one_directory_start_one(site):
    root, daemon, started = site
    out = root / "together"
    answers: list[tuple[int, dict]] = []
    callers = [threading.Thread(target=lambda: answers.append(train(daemon, out, root / "data")))
               for _ in range(2)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(120)
    started += [body["pid"] for code, body in answers if code == 201]
    assert sorted(code for code, _ in answers) == [201, 409], answers
    conflict = next(body for code, body in answers if code == 409)
    assert conflict["errors"]["out_dir"] == f"a training into {out} is already running"
    job = next(body for code, body in answers if code == 201)["job"]
    wait_until(lambda: daemon.job(job)["state"] == "running", 30, what="the one training running")
    assert [j["job"] for j in daemon.status()["jobs"]].count(job) == 1


def test_two_directories_of_the_same_last_name_are_two_jobs(site):
    root, daemon, started = site
    data = root / "data"
    first, second = train(daemon, root / "a" / "drafter", data), train(daemon, root / "b" / "drafter", data)
    started += [body["pid"] for code, body in (first, second) if code == 201]
    assert first[0] == 201 and second[0] == 201, (first, second)
    assert first[1]["job"] == "train-drafter" and second[1]["job"].startswith("train-drafter-")
    names = {j["job"] for j in daemon.status()["jobs"]}
    assert {first[1]["job"], second[1]["job"]} <= names
    again = train(daemon, root / "b" / "drafter", data)  # the same path keeps its name: a conflict
    assert again[0] == 409 and str(root / "b" / "drafter") in again[1]["errors"]["out_dir"], again

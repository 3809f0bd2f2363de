"""`hsmon online`: the real extractor and the real following trainer started by one command."""

from __future__ import annotations

import subprocess
import sys
import time

from extract_helpers import extract_env, make_dataset, tiny_model  # noqa: F401

from hsmon.contracts import spool
from hsmon.contracts.manifest_reader import read_manifest
from hsmon.online import add_arguments, extractor_has_spool_max, make_plan


def online_argv(data, out, model, *options: str) -> list[str]:
    """`hsmon online DATA --out OUT --model MODEL OPTIONS...`, the way the tests run it."""
    return [sys.executable, "-m", "hsmon", "online", str(data), "--out", str(out), "--model", str(model),
            *options]


def test_online_extracts_and_trains_every_row_then_exits_0(tmp_path, tiny_model):  # noqa: F811
    data = make_dataset(tmp_path / "data.jsonl", 24, min_lines=1, max_lines=2)
    out = tmp_path / "online"
    proc = subprocess.run(
        online_argv(data, out, tiny_model, "--chunk-size", "8", "--threads", "2", "--spool-max", "1GB",
                    "--train-arg=--batch-tokens=512", "--train-arg=--eval-fraction=0.1",
                    "--train-arg=--heartbeat=0.3", "--progress-every", "0.5"),
        capture_output=True, text=True, timeout=300, env=extract_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "extraction (1 thread)" in proc.stdout and "training (1 thread)" in proc.stdout  # not "1 threads"
    assert ("not bounded" in proc.stderr) != extractor_has_spool_max()
    ledger = spool.read_ledger(out / "spool")
    assert ledger.ended == "done" and ledger.passes and set(ledger.passes.values()) == {1}
    assert ledger.consumed_rows == len(ledger.passes) and len(read_manifest(out / "spool").rows) == 24
    assert (out / "drafter" / "checkpoints").is_dir()
    # while it runs: a line per side at the interval (not a terminal: plain lines)
    lines = proc.stdout.strip().splitlines()
    assert any(x.startswith("hsmon online: [") and "] extraction: " in x and " rows" in x for x in lines)
    assert any(x.startswith("hsmon online: [") and "] training: step " in x for x in lines)
    # the end says what the drafter is worth (the last loss, the estimate, the advice when it is
    # near 1) and what to run next
    verdict = next(x for x in lines if x.startswith("hsmon online: last loss "))
    assert "estimated acceptance length " in verdict, verdict
    if float(verdict.rsplit(" ", 1)[1]) < 1.1:
        assert lines[-2].startswith("no speed-up yet: ") and "more --passes" in lines[-2], lines[-3:]
    assert lines[-1].startswith(f"next: hsmon export-drafter {out / 'drafter'} --out ")
    assert f"hsmon eval-drafter --drafter {out / 'drafter-sglang'} --target-model {tiny_model}" in lines[-1]


def test_a_failed_side_s_one_line_error_is_repeated(tmp_path, tiny_model):  # noqa: F811
    """A spool limit the extractor refuses: `hsmon online` says the extractor's own fix, not only
    where its log is."""
    data = make_dataset(tmp_path / "data.jsonl", 16, min_lines=1, max_lines=2)
    out = tmp_path / "online"
    proc = subprocess.run(online_argv(data, out, tiny_model, "--chunk-size", "8", "--spool-max", "20k"),
                          capture_output=True, text=True, timeout=300, env=extract_env())
    assert proc.returncode == 1, proc.stdout + proc.stderr
    said = proc.stderr.strip().splitlines()[-1]
    assert said.startswith("hsmon online: the extraction failed (status 2): "), said
    assert "give --spool-max of at least " in said and f"(see {out / 'extract.log'})" in said, said


def test_spool_max_goes_to_the_extractor_only_when_it_lists_it():
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    argv = ["d.jsonl", "--out", "o", "--spool-max", "20GB", "--threads", "4", "--passes", "3"]
    args = parser.parse_args(argv)
    without, with_it = make_plan(args, spool_max_ok=False), make_plan(args, spool_max_ok=True)
    assert "--spool-max" not in without.extract and not without.spool_max_passed
    assert with_it.extract[with_it.extract.index("--spool-max") + 1] == "20GB"
    assert (with_it.extract_threads, with_it.train_threads) == (2, 2)
    assert with_it.train[with_it.train.index("--passes") + 1] == "3" and "--consume" in with_it.train


def test_ctrl_c_of_online_exits_130_and_reads_stopped_not_done(tmp_path, tiny_model):  # noqa: F811
    """Ctrl-C (SIGINT to the terminal's process group) once the trainer has stepped: `hsmon online`
    exits 130, and the online job reads ``stopped`` in `hsmon status` (each side's state, how to
    resume, no ETA), never ``done``."""
    import json
    import os
    import signal
    import time

    from extract_helpers import events_of, hsmon_status

    from hsmon.online import daemon_config

    data = make_dataset(tmp_path / "data.jsonl", 400, min_lines=1, max_lines=2)
    out = tmp_path / "online"
    proc = subprocess.Popen(
        online_argv(data, out, tiny_model, "--chunk-size", "8", "--threads", "2", "--passes", "2",
                    "--train-arg=--batch-tokens=512", "--train-arg=--eval-fraction=0.1",
                    "--train-arg=--heartbeat=0.3"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=extract_env(), start_new_session=True,
    )  # fmt: skip
    train_events = out / "spool" / "hsmon-train-events.jsonl"
    try:
        deadline = time.monotonic() + 240
        while not any(e["kind"] == "step" for e in events_of(train_events)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in its terminal sends
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, stdout + stderr
    assert "stopping both sides (SIGINT" in stderr and "done" not in stdout.splitlines()[-1], stdout + stderr
    start = next(e for e in events_of(out / "extract-events.jsonl") if e["kind"] == "start")
    config = daemon_config(out, start["pid"])  # the job `hsmon online --daemon` watches
    _, job = hsmon_status("--config", str(config), "--sample", "0.5")
    assert job["state"] == "stopped", json.dumps(job)[:3000]
    online = job["online"]
    assert online["consumer"]["state"] == "stopped" and online["producer"]["state"] in ("stopped", "done")
    assert "--resume" in job["reason"] and not job["progress"]["eta_s"], job["reason"]
    assert not [h for h in job["hints"] if h["severity"] == "critical"], job["hints"]


def test_keep_with_spool_max_is_refused_in_one_line(tmp_path):
    """Kept rows never leave the spool: a bounded spool would fill and the extraction wait for ever."""
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hello"}\n')
    res = subprocess.run([sys.executable, "-m", "hsmon", "online", str(data), "--out", str(tmp_path / "o"),
                          "--keep", "--spool-max", "12MB"], capture_output=True, text=True, timeout=60)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "--keep with --spool-max 12MB" in lines[0], res.stderr
    assert not (tmp_path / "o").exists()


def test_a_trainer_ending_at_max_steps_while_the_spool_is_full_ends_online(tmp_path, tiny_model):  # noqa: F811
    """The trainer ends at --max-steps 2 (status 0) while rows of a bounded spool wait: the
    extractor would wait for room for ever. `hsmon online` stops it and exits with the trainer's
    status and a line saying so (the dataset holds many times the limit: the spool fills whatever
    the machine's speed, and the run ends only once the extractor waits for room)."""
    from extract_helpers import events_of

    data = make_dataset(tmp_path / "data.jsonl", 80, min_lines=1, max_lines=2)
    out = tmp_path / "online"
    proc = subprocess.run(
        online_argv(data, out, tiny_model, "--chunk-size", "4", "--threads", "2", "--spool-max", "1500000",
                    "--train-arg=--max-steps=2", "--train-arg=--batch-tokens=256",
                    "--train-arg=--heartbeat=0.3"),
        capture_output=True, text=True, timeout=300, env=extract_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("hsmon online: the training ended (status 0, max_steps at step 2) while the "
                           "extraction waits for spool room"), proc.stdout
    assert "--resume" in last
    ledger = spool.read_ledger(out / "spool")
    # a limit the user set is a normal end: the ledger says done (as the trainer's events), with why
    assert ledger.ended == "done" and ledger.ended_reason == "max_steps"
    assert [e["kind"] for e in events_of(spool.train_events_path(out / "spool"))][-1] == "done"
    kinds = [e["kind"] for e in events_of(out / "extract-events.jsonl")]
    assert kinds[-1] == "stopped" and "pause" in kinds  # the extraction stopped, not finished
    assert len(read_manifest(out / "spool").rows) < 80


def test_a_trainer_ended_at_max_steps_beside_a_paused_extractor_pages_in_status(tmp_path, tiny_model):  # noqa: F811
    """Real extractor and trainer, watched as `hsmon online --daemon` watches them: the trainer ends at
    --max-steps 2 (status 0) and the extractor, its spool full, waits for room that never comes.
    `hsmon status` reads ``stopped`` with the critical ``trainer-ended`` hint naming the trainer and
    the resume, never ``running``. Waits on events (the trainer's exit, the extractor's pause), not
    on time."""
    from extract_helpers import critical_hints, hsmon_status, start_extract
    from test_train_follow import finish, kill_left, start_trainer

    from hsmon.online import daemon_config, extractor_waits_for_room

    data = make_dataset(tmp_path / "data.jsonl", 80, min_lines=1, max_lines=2)
    out = tmp_path / "online"
    spool_dir, events = out / "spool", out / "extract-events.jsonl"
    out.mkdir()
    extractor = start_extract(data, spool_dir, tiny_model, "--chunk-size", "4", "--threads", "1",
                              "--spool-max", "1500000", events=events)
    trainer = start_trainer(spool_dir, out / "drafter", tiny_model, "--max-steps", "2")
    try:
        finish(trainer, timeout=120)
        deadline = time.monotonic() + 120
        while not extractor_waits_for_room(events):
            assert extractor.poll() is None and time.monotonic() < deadline, "the extractor never paused"
            time.sleep(0.1)
        _, job = hsmon_status("--config", str(daemon_config(out, extractor.pid)), "--sample", "0.5")
    finally:
        kill_left(extractor, trainer)
    assert job["state"] == "stopped", job["reason"]
    (page,) = critical_hints(job)
    assert f"the trainer (PID {trainer.pid}) ended (training ended by --max-steps at step 2)" in page, page
    assert f"`hsmon train {spool_dir} --follow --resume`" in page and "will never come" in page
    # the trainer's figures travel in the online section, for `hsmon status` and the training tab
    figures = job["online"]["training"]
    assert figures["step"] == 2 and len(figures["loss"]) > 1 and figures["eta_s"] is None, figures


def test_on_a_terminal_one_line_for_both_sides_is_redrawn(tmp_path, monkeypatch):
    """A real pseudo-terminal: one progress line (hsmon/contracts/progress_line.py, as every long
    command draws) names both sides and what each waits for, and ends with a newline before any
    other line."""
    import os
    import pty
    import re
    import select

    from hsmon.contracts import events as ev
    from hsmon.online_progress import Progress

    (tmp_path / "spool").mkdir()
    with ev.EventWriter("x", str(tmp_path / "extract-events.jsonl")) as writer:
        writer.emit(ev.START, rows_total=100, tokens_total=1000)
        writer.emit(ev.ROWS, rows=10, tokens=100, rows_done=10, tokens_done=100)
        writer.emit(ev.PAUSE, reason="spool")
    monkeypatch.setenv("COLUMNS", "200")  # a wide terminal (a pseudo-terminal's size reads 0)
    main, side = pty.openpty()
    os.set_blocking(main, False)
    said = ""
    with os.fdopen(side, "w") as stream:
        progress = Progress(tmp_path, 30.0, stream)
        assert progress.terminal
        progress.tick(time.monotonic() + 2)  # a terminal redraws every second, not every 30 s
        progress.end_line()
    while select.select([main], [], [], 1)[0]:  # a pseudo-terminal may hand the line over in pieces
        try:
            said += os.read(main, 65536).decode()
        except OSError:
            break
    os.close(main)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", said)  # the terminal's codes (colours, cursor)
    assert "online" in text and "10/100 rows" in text, text
    assert "extraction paused: the spool is full" in text and "training: starting" in text, text
    assert text.rstrip(" ").endswith("\r\n") or text.rstrip(" ").endswith("\n"), repr(text)

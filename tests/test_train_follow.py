"""`hsmon train SPOOL --follow --passes E --consume` beside a real `hsmon extract` (the consumer):
rows trained as their chunks complete, each exactly E times per the ledger, chunks deleted only
after their passes, kill -9 of either side and its resume."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from extract_helpers import (  # noqa: F401
    events_of,
    extract_env,
    make_dataset,
    run_extract,
    start_extract,
    tiny_model,
    wait_for_event,
)

from hsmon.contracts import layout, spool
from hsmon.contracts.manifest_reader import read_manifest, read_row_records
from trainer.checkpoint import latest_checkpoint, load_checkpoint
from trainer.fed_rows import FED_ROWS_ENV, read_fed_rows
from trainer.model import DEFAULT_ARCH
from trainer.window import HeldOut

PASSES = 2
CHUNK = ["--chunk-size", "8", "--threads", "1"]


def trainer_cmd(spool_dir: Path, out: Path, model: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "hsmon", "train", str(spool_dir), "--follow", "--passes", str(PASSES),
            "--consume", "--target-model", str(model), "--out", str(out), "--threads", "1",
            "--batch-tokens", "512", "--checkpoint-every", "3", "--heartbeat", "0.3", "--poll", "0.1",
            "--eval-fraction", "0.1", *extra]


def fed_log(spool_dir: Path) -> Path:
    """Where the trainers of a spool's test log the rows each taken step fed (trainer/fed_rows.py)."""
    return spool_dir.parent / "fed-rows"


def trainer_env(spool_dir: Path, **more: str) -> dict[str, str]:
    return {**extract_env(), FED_ROWS_ENV: str(fed_log(spool_dir)), **more}


def start_trainer(spool_dir: Path, out: Path, model: Path, *extra: str,
                  env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(trainer_cmd(spool_dir, out, model, *extra), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=trainer_env(spool_dir, **(env or {})))


def wait_until(predicate, what: str, proc: subprocess.Popen[str] | None = None, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read()[-2000:] if proc.stderr else ""
            raise AssertionError(f"trainer ended (rc {proc.returncode}) before {what}: {err}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def finish(proc: subprocess.Popen[str], timeout: float = 180, status: int = 0) -> None:
    _, err = proc.communicate(timeout=timeout)
    assert proc.returncode == status, err[-3000:]


def kill_left(*procs: subprocess.Popen[str]) -> None:
    """Kill and reap the processes a test leaves running (after a failed assertion)."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def held_rule(spool_dir: Path) -> HeldOut:
    starts = [r for r in layout.iter_jsonl(spool.ledger_path(spool_dir)) if r.get("type") == "start"]
    return HeldOut.from_record(starts[0]["heldout"])


def assert_every_row_exactly_e(spool_dir: Path) -> None:
    """Per the batches the model was fed (the surviving taken steps' rows, trainer/fed_rows.py) and
    per the ledger: every training row of the manifest E passes, no other row any; training rows'
    files gone (every chunk consumed), held-out rows' files kept."""
    ledger = spool.read_ledger(spool_dir)
    records = read_row_records(spool_dir)
    rule = held_rule(spool_dir)
    training = {r for r in records if not rule.holds(r)}
    held = set(records) - training
    assert held and training
    assert dict(read_fed_rows(fed_log(spool_dir))) == dict.fromkeys(training, PASSES)
    assert {r: n for r, n in ledger.passes.items() if n} == dict.fromkeys(training, PASSES)
    assert ledger.ended == "done"
    assert ledger.consumed_chunks == set(read_manifest(spool_dir).chunks)
    assert ledger.consumed_rows == len(training)
    for row, rec in records.items():
        exists = (spool_dir / rec["chunk"] / layout.row_file_name(row)).exists()
        assert exists == (row in held), f"row {row}: file {'kept' if exists else 'gone'}"


def extraction_ended(spool_dir: Path) -> bool:
    logs = []
    for path in layout.manifest_paths(spool_dir):
        log = layout.RunLog()
        for record in layout.iter_jsonl(path):
            log.add(record)
        logs.append(log)
    return layout.summarize_runs(logs)["ending"] is not None


def trainer_events(spool_dir: Path) -> list[dict]:
    return events_of(spool.train_events_path(spool_dir))


def test_follow_consumes_while_extraction_stops_and_is_killed_then_resumed(tmp_path, tiny_model):  # noqa: F811
    """The trainer trains the rows of the chunks that exist while the extractor is stopped (SIGSTOP:
    deterministic), consumes them and waits with reason "rows"; the extractor is killed (-9) and
    resumed, and the trainer goes on to every row's E passes."""
    data = make_dataset(tmp_path / "data.jsonl", 96, min_lines=1, max_lines=3)
    spool_dir, out, ext_events = tmp_path / "spool", tmp_path / "train", tmp_path / "extract.jsonl"
    trainer = start_trainer(spool_dir, out, tiny_model)
    extractor = start_extract(data, spool_dir, tiny_model, *CHUNK, events=ext_events)
    try:
        seen: list[dict] = []
        wait_for_event(ext_events, lambda e: e["kind"] == "chunk" and (seen.append(e) or len(seen) >= 2),
                       extractor)
        os.kill(extractor.pid, signal.SIGSTOP)
        assert not extraction_ended(spool_dir), "the extraction ended before it was stopped: use more rows"
        chunks_now = set(read_manifest(spool_dir).chunks)
        wait_until(lambda: spool.read_ledger(spool_dir).consumed_chunks >= chunks_now,
                   "the trainer to consume the complete chunks", trainer)
        wait_until(lambda: any(e["kind"] == "pause" and e.get("reason") == "rows"
                               and e["ts"] > max(c["ts"] for c in trainer_events(spool_dir)
                                                 if c["kind"] == "step")
                               for e in trainer_events(spool_dir)),
                   "the trainer to wait for rows", trainer)
        os.kill(extractor.pid, signal.SIGKILL)
        extractor.wait(timeout=30)
        assert trainer.poll() is None, "the trainer must wait for the extraction's resume"
        assert not spool.read_ledger(spool_dir).ended
        proc = run_extract(data, spool_dir, tiny_model, *CHUNK, events=ext_events)
        assert proc.returncode == 0, proc.stderr
        finish(trainer)
    finally:
        kill_left(trainer, extractor)
    assert_every_row_exactly_e(spool_dir)
    kinds = [e["kind"] for e in trainer_events(spool_dir)]
    assert kinds.index("resume") < kinds.index("step") and kinds[-1] == "done"
    start = next(e for e in trainer_events(spool_dir) if e["kind"] == "start")
    assert start["arch"] == DEFAULT_ARCH and start["mode"] == "follow"  # as the offline trainer's start


def test_trainer_kill_9_then_resume_gives_every_row_exactly_e_passes(tmp_path, tiny_model):  # noqa: F811
    """kill -9 of the trainer after a checkpoint and some steps past it: up to the checkpoint the
    ledger shows no chunk deleted before its E passes; --resume gives the lost steps again and ends
    with every row at exactly E."""
    data = make_dataset(tmp_path / "data.jsonl", 64, min_lines=1, max_lines=3)
    spool_dir, out = tmp_path / "spool", tmp_path / "train"
    proc = run_extract(data, spool_dir, tiny_model, *CHUNK, events=tmp_path / "extract.jsonl")
    assert proc.returncode == 0, proc.stderr
    # steps held 0.2 s each: the kill, sent once steps passed a checkpoint, lands before the end
    trainer = start_trainer(spool_dir, out, tiny_model, "--window", "24",
                            env={"HSMON_TRAIN_STEP_DELAY_S": "0.2"})
    try:
        def past_a_consuming_checkpoint() -> bool:
            ledger = spool.read_ledger(spool_dir)
            steps = [e["step"] for e in trainer_events(spool_dir) if e["kind"] == "step"]
            return bool(ledger.consumed_chunks) and bool(steps) and steps[-1] > ledger.step + 1

        wait_until(past_a_consuming_checkpoint, "a consumed chunk and steps past its checkpoint", trainer)
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(timeout=30)
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
    # the ledger as the resume will read it: its passes up to the newest checkpoint
    step = load_checkpoint(latest_checkpoint(out))["step"]
    ledger = spool.Ledger()
    for record in layout.iter_jsonl(spool.ledger_path(spool_dir)):
        ledger.add(record)
    ledger.add({"type": "start", "step": step, "passes": PASSES})
    records = read_row_records(spool_dir)
    for row, rec in records.items():
        gone = not (spool_dir / rec["chunk"] / layout.row_file_name(row)).exists()
        if gone:
            assert rec["chunk"] in ledger.consumed_chunks and ledger.passes.get(row) == PASSES, row
    assert any(n < PASSES for n in ledger.passes.values()) or len(ledger.consumed_chunks) < 8
    wrong = subprocess.run(trainer_cmd(spool_dir, tmp_path / "elsewhere", tiny_model, "--resume"),
                           capture_output=True, text=True, timeout=120, env=extract_env())
    assert wrong.returncode == 2 and "has no checkpoint" in wrong.stderr  # refused: nothing written
    resumed = start_trainer(spool_dir, out, tiny_model, "--window", "24", "--resume")
    finish(resumed)
    assert_every_row_exactly_e(spool_dir)
    assert spool.read_ledger(spool_dir).starts == 2
    resumed_from = [e for e in trainer_events(spool_dir) if e["kind"] == "start"][-1]
    assert resumed_from["start_step"] == step and resumed_from["resumed_from"]


def test_a_bounded_spool_of_one_row_chunks_settles_the_vocabulary_on_half_its_limit(tmp_path, tiny_model):  # noqa: F811
    """With --spool-max and chunks of one row the trainer does not take its draft vocabulary and step
    budget from the first row alone: it waits (seconds: the extractor fills the spool without it)
    for the rows of half the limit, then trains every row E times, the extractor pausing for room."""
    data = make_dataset(tmp_path / "data.jsonl", 24, min_lines=2, max_lines=3)
    spool_dir, out, ext_events = tmp_path / "spool", tmp_path / "train", tmp_path / "extract.jsonl"
    trainer = start_trainer(spool_dir, out, tiny_model)
    extractor = start_extract(data, spool_dir, tiny_model, "--chunk-size", "1", "--threads", "1",
                              "--spool-max", "700000", events=ext_events)
    try:
        finish(trainer)
        assert extractor.wait(timeout=60) == 0
    finally:
        kill_left(trainer, extractor)
    assert_every_row_exactly_e(spool_dir)
    start = next(e for e in trainer_events(spool_dir) if e["kind"] == "start")
    first, last = (layout.parse_chunk_dir_name(name) for name in start["setup_sample"].split(".."))
    assert first is not None and last is not None
    assert last[1] - first[0] >= 3, start["setup_sample"]  # several one-row chunks, not the first alone
    # the draft vocabulary's counts are the whole dataset's, from the extraction's scan
    assert start["vocab_from"] == "the extraction's scan (24 rows)", start["vocab_from"]
    assert any(e["kind"] == "pause" and e.get("reason") == "spool" for e in events_of(ext_events))
    # the schedule is laid over the steps the run takes (trainer/follow_budget.py), not over the
    # set-up sample's estimate: the budget the last step saw is within a step or two of the run's
    # steps (re-estimated after every step from the tenth), so its learning rate is near the floor
    # (10 % of the peak; the cosine's last 20 % stays under 19 %)
    steps = [e for e in trainer_events(spool_dir) if e["kind"] == "step"]
    last, peak = steps[-1], max(e["lr"] for e in steps)
    assert abs(last["total_steps"] - last["step"]) <= max(2, last["step"] // 10), (start["total_steps"], last)
    assert last["lr"] <= 0.19 * peak, (last["lr"], peak)


@pytest.mark.parametrize("extra", [["--consume"]])
def test_passes_and_consume_need_follow(tmp_path, extra):
    cmd = [sys.executable, "-m", "hsmon", "train", str(tmp_path), "--out", str(tmp_path / "o"), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--follow" in proc.stderr


@pytest.mark.slow
def test_two_extraction_shards_and_two_ddp_ranks_share_one_spool(tmp_path, tiny_model):  # noqa: F811
    """Shards 0/2 and 1/2 of `hsmon extract` write one spool; `hsmon train --follow` under torchrun
    (2 CPU processes, gloo) trains every row of both exactly E times, rank 0 alone writing the ledger."""
    data = make_dataset(tmp_path / "data.jsonl", 48, min_lines=1, max_lines=2)
    spool_dir, out = tmp_path / "spool", tmp_path / "train"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                "-m", "hsmon", *trainer_cmd(spool_dir, out, tiny_model)[3:]]
    trainer = subprocess.Popen(torchrun, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               env=trainer_env(spool_dir))
    shards = [start_extract(data, spool_dir, tiny_model, *CHUNK, "--shard", f"{i}/2",
                            events=tmp_path / f"extract-{i}.jsonl") for i in range(2)]
    try:
        for shard in shards:
            _, err = shard.communicate(timeout=180)
            assert shard.returncode == 0, err
        finish(trainer, timeout=240)
    finally:
        kill_left(trainer, *shards)
    assert len(layout.manifest_paths(spool_dir)) == 2
    assert_every_row_exactly_e(spool_dir)
    seen = trainer_events(spool_dir)
    start = next(e for e in seen if e["kind"] == "start")
    assert start["world_size"] == 2 and seen[-1]["kind"] == "done" and seen[-1]["ranks_in_sync"] is True
    assert sum(1 for e in seen if e["kind"] == "start") == 1  # rank 0 alone writes events and the ledger
    assert spool.read_ledger(spool_dir).starts == 1


def test_sigterm_while_waiting_for_the_first_chunk_stops_cleanly(tmp_path, tiny_model):  # noqa: F811
    """A trainer started before its extraction waits (pause "rows", heartbeats: alive), and SIGTERM
    ends it with a `stopped` event and ledger record, exit 143 (128 + SIGTERM: stopped, not done)."""
    spool_dir = tmp_path / "spool"
    trainer = start_trainer(spool_dir, tmp_path / "train", tiny_model)
    try:
        wait_until(lambda: [e["kind"] for e in trainer_events(spool_dir)].count("heartbeat") >= 2,
                   "heartbeats while waiting", trainer)
        assert [e.get("reason") for e in trainer_events(spool_dir) if e["kind"] == "pause"] == ["rows"]
        # one consumer per spool and one writer per --out: a second is refused in one line naming the
        # first's PID and host, before it writes an event
        for other_spool, other_out, flag in ((spool_dir, tmp_path / "train2", "spool (DATA_DIR)"),
                                             (tmp_path / "spool2", tmp_path / "train", "--out")):
            second = subprocess.run(trainer_cmd(other_spool, other_out, tiny_model), capture_output=True,
                                    text=True, env=extract_env(), timeout=120)
            assert second.returncode == 2, second.stderr
            (line,) = second.stderr.strip().splitlines()
            assert f"is being written by PID {trainer.pid} on host {socket.gethostname()}" in line, line
            assert line.startswith("hsmon train: ") and line.endswith(f"or give another {flag}"), line
        kinds = [e["kind"] for e in trainer_events(spool_dir)]
        assert kinds.count("pause") == 1 and "error" not in kinds  # the first's events alone
        trainer.send_signal(signal.SIGTERM)
        finish(trainer, timeout=60, status=143)
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
    assert trainer_events(spool_dir)[-1]["kind"] == "stopped"
    assert spool.read_ledger(spool_dir).ended == "stopped"


def test_a_consuming_trainer_refuses_a_manifest_chunk_outside_the_spool(tmp_path, tiny_model):  # noqa: F811
    """A manifest naming `../victim` as a chunk: the trainer ends with one line naming the manifest
    and the line, and the file outside the spool is still there."""
    spool_dir, victim = tmp_path / "spool", tmp_path / "victim"
    spool_dir.mkdir()
    victim.mkdir()
    (victim / "data_0.ckpt").write_bytes(b"not the trainer's to delete")
    records = [{"type": "run", "rows_total": 1}, {"type": "row", "row": 0, "chunk": "../victim", "tokens": 20,
                                                  "bytes": 100}, {"type": "chunk", "chunk": "../victim"}]
    layout.append_jsonl(spool_dir / layout.manifest_name(), records)
    res = subprocess.run(trainer_cmd(spool_dir, tmp_path / "train", tiny_model), capture_output=True,
                         text=True, env=extract_env(), timeout=300)
    assert res.returncode != 0 and "Traceback" not in res.stderr, res.stderr
    line = res.stderr.strip().splitlines()[-1]
    assert "hsmon-manifest.jsonl" in line and "chunk '../victim' is not a chunk directory" in line, line
    assert (victim / "data_0.ckpt").read_bytes() == b"not the trainer's to delete"

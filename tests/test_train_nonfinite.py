"""hsmon train on data with NaN rows and with a loss that becomes NaN: it skips, counts, says so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from extract_helpers import hsmon_status, run_extract
from nonfinite_helpers import nan_embedding_target, overflow_embedding_target, token_rows

from hsmon.contracts.events import encode_event, iter_events
from hsmon.contracts.layout import MANIFEST_NAME, iter_jsonl
from trainer.data import build_index

ROOT = Path(__file__).resolve().parents[1]
BAD_ROWS = {3, 9}
FAST = ["--threads", "1", "--heartbeat", "5", "--batch-tokens", "64", "--eval-fraction", "0"]


def train(data: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "hsmon", "train", str(data), "--out", str(out), *FAST, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.fixture(scope="module")
def nan_target(tmp_path_factory) -> Path:
    return nan_embedding_target(tmp_path_factory.mktemp("nan-target") / "model")


@pytest.fixture(scope="module")
def nan_data(tmp_path_factory, nan_target) -> Path:
    """12 rows extracted with the corrupted target; rows 3 and 9 hold its NaN token."""
    base = tmp_path_factory.mktemp("nan-data")
    dataset = token_rows(base / "rows.jsonl", 12, BAD_ROWS)
    out = base / "out"
    proc = run_extract(dataset, out, nan_target, "--chunk-size", "4")
    assert proc.returncode == 0, proc.stderr
    return out


def test_event_writer_writes_null_for_nan_and_names_the_field():
    line = encode_event({"kind": "step", "loss": float("nan"), "losses": [1.0, float("inf")]})
    event = json.loads(line)
    assert event["loss"] is None and event["losses"] == [1.0, None]
    assert event["nonfinite_fields"] == ["loss", "losses[1]"]


def test_manifest_stats_mark_the_nan_rows_and_the_index_leaves_them_out(nan_data, tmp_path):
    records = {r["row"]: r for r in iter_jsonl(nan_data / MANIFEST_NAME) if r.get("type") == "row"}
    assert {row for row, r in records.items() if any(s[6] for s in r["stats"].values())} == BAD_ROWS
    assert sorted(build_index(nan_data).nonfinite_rows) == sorted(BAD_ROWS)
    # the same data without stats (an older manifest): each row's tensors are checked once instead
    bare = tmp_path / "bare"
    bare.mkdir()
    for chunk in nan_data.glob("rows_*"):
        (bare / chunk.name).symlink_to(chunk)
    (bare / MANIFEST_NAME).write_text("".join(
        json.dumps({k: v for k, v in r.items() if k != "stats"}) + "\n" for r in records.values()))
    assert sorted(build_index(bare).nonfinite_rows) == sorted(BAD_ROWS)


def test_train_skips_nan_rows_and_says_so(nan_data, tmp_path):
    events = tmp_path / "train.jsonl"
    proc = train(nan_data, tmp_path / "run", "--max-steps", "3", "--events", str(events),
                 "--max-bad-fraction", "0.2")
    assert proc.returncode == 0, proc.stderr
    assert "skipping 2 rows that hold NaN/Inf hidden states (rows 3, 9)" in proc.stderr
    start = next(e for e in iter_events(events) if e["kind"] == "start")
    assert start["nonfinite_rows"] == 2 and start["nonfinite_row_ids"] == [3, 9]
    assert start["total_rows"] == 10
    steps = [e for e in iter_events(events) if e["kind"] == "step"]
    assert steps and all(e["loss"] is not None and e["skipped_steps"] == 0 for e in steps)
    # more bad rows than allowed (the default 0.1): refuses to start, one line
    refused = train(nan_data, tmp_path / "run2", "--max-steps", "3")
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines() == [
        f"hsmon train: {nan_data}: 2 of 12 rows hold NaN/Inf hidden states (rows 3, 9), more than "
        "--max-bad-fraction 0.1; re-extract them (check the target's weights and --dtype) or raise "
        "--max-bad-fraction to train on the rest"]


def test_float16_overflow_rows_are_named_by_the_daemon_and_skipped_by_the_trainer(tmp_path):
    """`--dtype float16` with a target whose embedding row 777 peaks at 1e5 (beyond float16's
    65,504): rows 3 and 9, which hold that token, overflow; the status names them and the layers,
    and hsmon train leaves them out."""
    target = overflow_embedding_target(tmp_path / "overflow")
    out = tmp_path / "out"
    proc = run_extract(token_rows(tmp_path / "rows.jsonl", 12, BAD_ROWS), out, target, "--chunk-size", "4",
                       "--dtype", "float16")
    assert proc.returncode == 0, proc.stderr
    _, job = hsmon_status("--out", str(out))
    data = job["output"]["data"]
    assert data["nonfinite_rows"] == 2 and data["first_nonfinite_rows"] == [3, 9]
    (hint,) = [h for h in job["hints"] if h["id"] == "data-nonfinite"]
    assert hint["severity"] == "warning" and hint["message"].startswith(
        "2 rows of the output hold NaN/Inf hidden states (rows 3, 9; layer final: 2 rows")
    for layer in ("2", "4", "5"):
        assert f"layer {layer}: 2 rows" in hint["message"]
    events = tmp_path / "train.jsonl"
    trained = train(out, tmp_path / "run", "--max-steps", "2", "--events", str(events),
                    "--max-bad-fraction", "0.2")
    assert trained.returncode == 0, trained.stderr
    assert "skipping 2 rows that hold NaN/Inf hidden states (rows 3, 9)" in trained.stderr
    steps = [e for e in iter_events(events) if e["kind"] == "step"]
    assert steps and all(e["loss"] is not None and e["skipped_steps"] == 0 for e in steps)


def test_nan_loss_skips_steps_and_stops_after_too_many_in_a_row(nan_target, tmp_path):
    """Finite data, but the drafter's frozen embedding (from the corrupted target) makes the loss NaN
    on every batch holding the bad token."""
    dataset = token_rows(tmp_path / "rows.jsonl", 8, set(range(8)))
    data = tmp_path / "clean"
    proc = run_extract(dataset, data, _clean(), "--chunk-size", "4")
    assert proc.returncode == 0, proc.stderr
    events = tmp_path / "train.jsonl"
    proc = train(data, tmp_path / "run", "--target-model", str(nan_target), "--max-steps", "20",
                 "--max-skipped-steps", "3", "--events", str(events))
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hsmon train: training stopped at step 0: the loss was "
                                                   "not finite in 3 steps in a row"), proc.stderr
    kinds = [e["kind"] for e in iter_events(events)]
    skips = [e for e in iter_events(events) if e["kind"] == "skip"]
    assert [s["in_a_row"] for s in skips] == [1, 2, 3] and skips[0]["reason"] == "non-finite loss"
    assert kinds[-1] == "error" and "nonfinite_fields" not in events.read_text()


def test_a_nan_loss_now_and_then_is_skipped_and_the_run_goes_on(nan_target, tmp_path):
    dataset = token_rows(tmp_path / "rows.jsonl", 16, {5, 11})
    data = tmp_path / "clean"
    proc = run_extract(dataset, data, _clean(), "--chunk-size", "8")
    assert proc.returncode == 0, proc.stderr
    events = tmp_path / "train.jsonl"
    proc = train(data, tmp_path / "run", "--target-model", str(nan_target), "--epochs", "1",
                 "--max-skipped-steps", "3", "--events", str(events))
    assert proc.returncode == 0, proc.stderr
    skips = [e for e in iter_events(events) if e["kind"] == "skip"]
    done = next(e for e in iter_events(events) if e["kind"] == "done")
    assert skips and done["skipped_steps"] == len(skips)
    assert all(set(s["rows"]) & {5, 11} for s in skips)  # only batches holding the bad token
    steps = [e for e in iter_events(events) if e["kind"] == "step"]
    assert steps and all(e["loss"] is not None and e["grad_norm"] is not None for e in steps)


def _clean() -> Path:
    from extractor.embedded_target import ensure_embedded_target

    return ensure_embedded_target()


def test_a_following_trainer_credits_no_pass_for_a_skipped_step(nan_target, tmp_path):
    """Every batch of this spool holds a row whose loss is NaN under the corrupted target: every
    step is skipped. No pass is credited for a step that did not update the weights (the ledger
    says each skip), so no row reaches E and nothing leaves the spool; the run stops after
    --max-skipped-steps in a row. (Crediting skipped steps ended this run `done`, every row at E
    in the ledger, on a drafter never trained.)"""
    from test_train_follow import fed_log, trainer_cmd, trainer_env

    from hsmon.contracts import spool
    from trainer.fed_rows import read_fed_rows

    dataset = token_rows(tmp_path / "rows.jsonl", 16, {5, 11})
    spool_dir = tmp_path / "spool"
    proc = run_extract(dataset, spool_dir, _clean(), "--chunk-size", "8")
    assert proc.returncode == 0, proc.stderr
    cmd = trainer_cmd(spool_dir, tmp_path / "run", nan_target, "--eval-fraction", "0",
                      "--max-skipped-steps", "3", "--checkpoint-every", "1")
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=trainer_env(spool_dir))
    assert run.returncode != 0 and "not finite in 3 steps in a row" in run.stderr, run.stderr[-2000:]
    ledger = spool.read_ledger(spool_dir)
    assert ledger.skipped_steps == 3 and not any(ledger.passes.values()) and not ledger.consumed_chunks
    assert not read_fed_rows(fed_log(spool_dir))  # no batch trained the model
    assert len(list(spool_dir.glob("rows_*/data_*.ckpt"))) == 16  # nothing deleted

"""`hsmon extract --spool-max` (issue 29): the real command pauses (reason spool) while the rows not
yet consumed would exceed the limit, and resumes as the trainer's ledger records consumption.

The trainer's side here is the contract's other party written by the test as `hsmon train --follow
--consume` writes it (contract 4: a ``consumed`` record appended to SPOOL/hsmon-ledger.jsonl, the
chunk's row files deleted), not a fake of the product: the product under test is the extractor.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from extract_helpers import (  # noqa: F401 (tiny_model is a fixture)
    events_of,
    make_dataset,
    run_extract,
    start_extract,
    tiny_model,
    wait_for_event,
)

from hsmon.contracts import layout, spool
from hsmon.contracts.manifest_reader import read_manifest
from hsmon.contracts.spool_fill import SpoolFill

pytestmark = pytest.mark.slow

OPTS = ("--chunk-size", "4", "--batch-tokens", "256")
LIMIT = 700_000  # about two chunks of this dataset's rows: the run must pause several times


@pytest.fixture
def spool_dir(tmp_path):
    """The spool on a real tmpfs (as /dev/shm would hold it) when root can mount one, else on disk."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        yield tmp_path / "spool"
        return
    mount = tmp_path / "shm"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], check=True)
    try:
        yield mount / "spool"
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            subprocess.run(["umount", "-l", str(mount)], check=True)


def consume_complete_chunks(out: Path, consumed: set[str]) -> int:
    """As the following trainer with --consume does: for each complete chunk not consumed yet,
    delete its row files and append its ``consumed`` record (fsynced). Returns the chunks consumed."""
    records = []
    for name, chunk in read_manifest(out).chunks.items():
        if name in consumed:
            continue
        for path in (out / name).glob("data_*.ckpt"):
            path.unlink()
        records.append({"type": "consumed", "ts": time.time(), "chunk": name, "rows": chunk["rows"],
                        "bytes": chunk["bytes"]})
        consumed.add(name)
    if records:
        layout.append_jsonl(spool.ledger_path(out), records)
    return len(records)


def test_spool_pauses_when_full_and_resumes_as_the_trainer_consumes(tmp_path, spool_dir, tiny_model):  # noqa: F811
    data = make_dataset(tmp_path / "d.jsonl", rows=40, seed=7, min_lines=2, max_lines=3)
    events = tmp_path / "events.jsonl"
    proc = start_extract(data, spool_dir, tiny_model, *OPTS, "--spool-max", str(LIMIT), events=events)
    consumed: set[str] = set()
    peak = 0
    try:
        pause = wait_for_event(events, lambda e: e["kind"] == "pause", proc, timeout=120)
        assert pause["reason"] == "spool" and pause["max_bytes"] == LIMIT
        assert pause["message"].startswith("spool full: ") and "waiting for the trainer" in pause["message"]
        assert spool.read_spool_limit(spool_dir) == LIMIT
        level = SpoolFill(spool_dir).poll()
        assert level.waiting_bytes + pause["need_bytes"] > LIMIT >= level.waiting_bytes
        time.sleep(0.6)  # paused, it writes nothing while nothing is consumed
        assert SpoolFill(spool_dir).poll().row_bytes == level.row_bytes
        fill = SpoolFill(spool_dir)
        while proc.poll() is None:
            peak = max(peak, fill.poll().waiting_bytes)
            consume_complete_chunks(spool_dir, consumed)
            time.sleep(0.05)
        assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
        stderr = proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    kinds = [(e["kind"], e.get("reason")) for e in events_of(events)]
    assert kinds[-1] == ("done", None)
    pauses = kinds.count(("pause", "spool"))
    assert pauses >= 1 and kinds.count(("resume", "spool")) == pauses
    assert "paused (spool): spool full: " in stderr and "resumed (spool)" in stderr
    level = SpoolFill(spool_dir).poll()
    assert peak <= LIMIT and level.rows == 40
    consume_complete_chunks(spool_dir, consumed)
    assert SpoolFill(spool_dir).poll().waiting_bytes == 0
    assert not list(spool_dir.glob("rows_*/data_*.ckpt")), "every consumed row file was deleted"


def test_stop_while_full_then_resume_with_a_larger_limit(tmp_path, tiny_model):  # noqa: F811
    data = make_dataset(tmp_path / "d.jsonl", rows=24, seed=8, min_lines=2, max_lines=3)
    out, events = tmp_path / "spool", tmp_path / "events.jsonl"
    proc = start_extract(data, out, tiny_model, *OPTS, "--spool-max", str(LIMIT), events=events)
    try:
        wait_for_event(events, lambda e: e["kind"] == "pause" and e["reason"] == "spool", proc, timeout=120)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert events_of(events)[-1]["kind"] == "stopped"
    written = SpoolFill(out).poll().rows
    assert 0 < written < 24
    # a resume may change the limit: one that holds everything never pauses
    again = run_extract(data, out, tiny_model, *OPTS, "--spool-max", "1G", events=events)
    assert again.returncode == 0, again.stderr
    assert spool.read_spool_limit(out) == 1_000_000_000
    kinds = [e["kind"] for e in events_of(events)]
    assert kinds[-1] == "done" and "pause" not in kinds[kinds.index("start", 1):]
    assert SpoolFill(out).poll().rows == 24


def test_bad_or_too_small_spool_max_is_one_line(tmp_path, tiny_model):  # noqa: F811
    data = make_dataset(tmp_path / "d.jsonl", rows=8, seed=9)
    bad = run_extract(data, tmp_path / "a", tiny_model, "--spool-max", "lots")
    assert bad.returncode == 2 and "--spool-max" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    small = run_extract(data, tmp_path / "b", tiny_model, *OPTS, "--spool-max", "10k")
    assert small.returncode == 2 and "holds less than one chunk" in small.stderr
    assert not (tmp_path / "b" / spool.SPOOL_NAME).exists()

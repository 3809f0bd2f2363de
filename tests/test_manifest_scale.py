"""The manifest readers at scale: running totals equal a from-scratch sum whatever arrives (appends,
a torn last line, a resume, shards, rejects); a resume skips exactly the handled rows of a
100k-row manifest; a monitor answers while it reads a large manifest."""

from __future__ import annotations

import json
import random
import threading
import time
from array import array
from pathlib import Path

import pytest
from synthetic_output import row_record, run_record, scratch_totals, write_synthetic_output

from extractor import dataset as ds
from extractor.prepare import resume_book
from hsmon.contracts import layout, manifest_reader
from hsmon.contracts.manifest_reader import RowSet, read_manifest, read_row_records
from hsmon.core.config import JobConfig
from hsmon.core.monitor import Monitor
from hsmon.core.trackers import output_dir
from hsmon.core.trackers.output_dir import OutputDirTracker

FIGURES = ("rows", "tokens", "bytes", "rejects", "chunks_complete")


def assert_matches_scratch(tracker: OutputDirTracker, out: Path) -> None:
    tracker.scan()
    snap, want = tracker.snapshot(), scratch_totals(out)
    assert {k: getattr(snap, k) for k in FIGURES} == {k: want[k] for k in FIGURES}
    assert set(tracker.manifest.rows) == want["row_ids"]


def test_row_set_is_a_set_of_ints():
    rows = RowSet([5, 0, 7, 5, 1 << 30, -3])
    assert len(rows) == 5 and list(rows) == [-3, 0, 5, 7, 1 << 30]
    assert 5 in rows and 6 not in rows and 10**9 not in rows and "5" not in rows
    assert rows.add(6) and not rows.add(6) and len(rows) == 6


def test_running_totals_equal_a_scratch_sum_through_appends_torn_line_resume_and_rejects(tmp_path):
    out = tmp_path / "out"
    write_synthetic_output(out, 5000, chunk_size=1000, reject_every=7, done=range(3000))
    tracker = OutputDirTracker(str(out))
    assert_matches_scratch(tracker, out)
    manifest = out / layout.MANIFEST_NAME
    rng = random.Random(1)
    layout.append_jsonl(manifest, [row_record(i, 1000, rng) for i in range(3000, 3100) if i % 7 != 6])
    assert_matches_scratch(tracker, out)
    # a crash mid-append leaves half a line: not counted, and not glued to what comes next
    whole = json.dumps(row_record(3100, 1000, rng), separators=(",", ":"))
    with open(manifest, "a") as fh:
        fh.write(whole[: len(whole) // 2])
    assert_matches_scratch(tracker, out)
    assert 3100 not in tracker.manifest.rows
    # the resumed writer cuts it and writes more than it was (old readers lost a record here)
    assert layout.repair_jsonl_tail(manifest) > 0
    layout.append_jsonl(manifest, [run_record(5000)])
    layout.append_jsonl(manifest, [row_record(i, 1000, rng) for i in range(3100, 3300) if i % 7 != 6]
                        + [{"type": "reject", "row": 6, "reason": "listed twice"}])
    assert_matches_scratch(tracker, out)
    assert {3101, 3102, 3299} <= set(tracker.manifest.rows)
    assert len(tracker.manifest.runs) == 2 and tracker.snapshot().ending is None
    # a row recorded twice counts once
    layout.append_jsonl(manifest, [row_record(3101, 1000, rng, tokens=3)])
    assert_matches_scratch(tracker, out)
    # per-chunk totals add up to the whole
    totals = tracker.manifest.row_totals
    assert sum(t.rows for t in totals.values()) == len(tracker.manifest.rows)
    assert sum(t.tokens for t in totals.values()) == tracker.manifest.tokens
    assert totals["rows_3000-4000"].rows == len([i for i in range(3000, 3300) if i % 7 != 6])


def test_running_totals_over_shards_and_a_replaced_manifest(tmp_path):
    out = tmp_path / "out"
    rng = random.Random(2)
    for index in range(2):
        path = out / layout.manifest_name((index, 2))
        out.mkdir(exist_ok=True)
        layout.append_jsonl(path, [run_record(100, {"shard": [index, 2]})]
                            + [row_record(i, 10, rng) for i in range(100) if i // 10 % 2 == index])
    tracker = OutputDirTracker(str(out))
    assert_matches_scratch(tracker, out)
    assert tracker.snapshot().rows_total == 200
    replaced = out / layout.manifest_name((1, 2))
    tmp = out / "new.tmp"
    layout.append_jsonl(tmp, [run_record(100, {"shard": [1, 2]}), row_record(10, 10, rng)])
    tmp.replace(replaced)
    assert_matches_scratch(tracker, out)
    assert tracker.snapshot().rows == 51


def test_resume_skips_exactly_the_handled_rows_at_100k_rows(tmp_path):
    rows = 100_000
    rng = random.Random(3)
    lengths = array("q", (rng.randint(5, 3000) for _ in range(rows)))
    # done: the first 61,234 rows but a scatter of holes (rows a crash left undone)
    holes = set(rng.sample(range(61_234), 500))
    done = {i for i in range(61_234) if i not in holes}
    out = tmp_path / "out"
    written = write_synthetic_output(out, rows, reject_every=97, done=done, lengths=lengths)
    manifest = read_manifest(out, layout.MANIFEST_NAME, keep_open_rows=True)
    valid = [i for i in range(rows) if i not in written.rejects]
    scan = ds.ScanResult(lines=rows, rows=array("q", valid), lengths=array("q", (lengths[i] for i in valid)))
    book = resume_book(scan, manifest, lambda n: 10 * n)
    assert set(book.done) == written.rows and len(book.done) == len(written.rows)
    assert all((i in book.done) == (i in written.rows) for i in range(rows))
    assert all(manifest.handled(i) == (i in written.rows or i in written.rejects) for i in range(rows))
    assert book.done_tokens == sum(lengths[i] for i in written.rows) == manifest.tokens
    assert book.done_bytes == written.bytes
    left = [i for i in valid if i not in written.rows]
    assert book.needed == 10 * sum(lengths[i] for i in left)
    assert book.longest_left == max(lengths[i] for i in left)
    # only chunks with holes are open: their records are kept, and only theirs
    open_chunks = {layout.chunk_dir_name(*layout.chunk_bounds(i, 2000)) for i in left}
    kept = manifest.open_row_records()
    assert {r["chunk"] for r in kept} <= open_chunks and len(manifest.chunks) == written.chunks
    assert [r["row"] for r in kept] == sorted(i for i in written.rows
                                              if layout.chunk_dir_name(*layout.chunk_bounds(i, 2000))
                                              not in manifest.chunks)
    # whoever needs whole records reads those few again
    sample = [0, 1999, 60_001]
    assert {r: rec["row"] for r, rec in read_row_records(out, sample).items()} == {
        r: r for r in sample if r in written.rows}


def test_a_monitor_answers_while_it_reads_a_large_manifest(tmp_path, monkeypatch):
    out = tmp_path / "out"
    written = write_synthetic_output(out, 20_000)
    gate, entered = threading.Event(), threading.Event()
    parse = manifest_reader.parse_lines

    def gated(data, handle):  # the reading thread waits at its second block until the test says
        if threading.current_thread() is not threading.main_thread() and entered.is_set():
            gate.wait(30)
        entered.set()
        return parse(data, handle)

    monkeypatch.setattr(manifest_reader, "parse_lines", gated)
    monkeypatch.setattr(manifest_reader, "BLOCK_BYTES", 256 * 1024)
    monkeypatch.setattr(output_dir, "BACKGROUND_BYTES", 1024 * 1024)
    monitor = Monitor([JobConfig(name="big", out_dir=str(out))], use_watchdog=False, tick_interval=0.05)
    try:
        started = time.monotonic()
        monitor.start()
        assert time.monotonic() - started < 10
        assert entered.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the next tick publishes the first block's progress
            (job,) = monitor.status_document()["jobs"]
            if (job["output"]["reading"] or {}).get("bytes_done"):
                break
            time.sleep(0.02)
        assert job["state"] == "starting" and "reading the manifest" in job["reason"], job["reason"]
        reading = job["output"]["reading"]
        size = (out / layout.MANIFEST_NAME).stat().st_size
        assert 0 < reading["bytes_done"] < reading["bytes_total"] == size
        assert job["output"]["rows"] is None  # no partial figures taken for progress
        gate.set()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            (job,) = monitor.status_document()["jobs"]
            if job["output"]["rows"] is not None:
                break
            time.sleep(0.05)
        assert job["output"]["rows"] == len(written.rows) and job["output"]["reading"] is None
        assert job["output"]["chunks_complete"] == written.chunks
        assert "reading" not in job["reason"]
    finally:
        gate.set()
        monitor.stop()


@pytest.mark.parametrize("background", [False, True])
def test_one_shot_and_background_reads_agree(tmp_path, monkeypatch, background):
    out = tmp_path / "out"
    write_synthetic_output(out, 6000, reject_every=11)
    monkeypatch.setattr(output_dir, "BACKGROUND_BYTES", 64 * 1024)
    tracker = OutputDirTracker(str(out))
    tracker.scan(background=background)
    deadline = time.monotonic() + 30
    while tracker.reading is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    tracker.scan(background=background)
    snap, want = tracker.snapshot(), scratch_totals(out)
    assert {k: getattr(snap, k) for k in FIGURES} == {k: want[k] for k in FIGURES}

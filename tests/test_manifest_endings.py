"""The manifest's plan and ending as the output tracker reads them from real files:
done, stopped, resumed (not done), older manifests without either, and shards."""

from __future__ import annotations

from pathlib import Path

from hsmon.contracts import layout
from hsmon.core.trackers.output_dir import OutputDirTracker


def run_record(rows: int, shard: tuple[int, int] = (0, 1), plan: bool = True) -> dict:
    record = {"type": "run", "settings": {"shard": list(shard)}, "pid": 1, "started": 100.0, "rows_done": 0}
    if plan:
        record.update(rows_total=rows, tokens_total=10 * rows, chunks_total=1)
    return record


def rows(n: int, chunk: str = "rows_0-2000") -> list[dict]:
    return [{"type": "row", "row": i, "chunk": chunk, "tokens": 10, "bytes": 100} for i in range(n)]


def ending(kind: str, n: int, ts: float = 200.0, seconds: float = 12.5) -> dict:
    return {"type": kind, "ts": ts, "rows": n, "tokens": 10 * n, "bytes": 100 * n, "seconds": seconds}


def scan(out: Path, records_by_name: dict[str, list[dict]]) -> dict:
    out.mkdir(exist_ok=True)
    for name, records in records_by_name.items():
        layout.append_jsonl(out / name, records)
    tracker = OutputDirTracker(str(out))
    tracker.scan()
    return tracker.snapshot()


def test_done_record_gives_plan_ending_and_duration(tmp_path):
    snap = scan(tmp_path / "o", {layout.MANIFEST_NAME: [run_record(3), *rows(3), ending("done", 3)]})
    assert (snap.rows, snap.rows_total, snap.tokens_total, snap.chunks_total) == (3, 3, 30, 1)
    assert (snap.ending, snap.ending_ts, snap.run_seconds) == ("done", 200.0, 12.5)


def test_stopped_then_resumed_is_not_ended_until_the_resume_ends(tmp_path):
    out = tmp_path / "o"
    stopped = [run_record(3), *rows(1), ending("stopped", 1)]
    assert scan(out, {layout.MANIFEST_NAME: stopped}).ending == "stopped"
    tracker = OutputDirTracker(str(out))
    tracker.scan()
    layout.append_jsonl(out / layout.MANIFEST_NAME, [run_record(3), *rows(2)])  # the resume, mid-run
    tracker.scan()
    assert tracker.snapshot().ending is None and tracker.snapshot().rows == 2
    layout.append_jsonl(out / layout.MANIFEST_NAME, [*rows(3), ending("done", 3, ts=300.0)])
    tracker.scan()
    assert tracker.snapshot().ending == "done" and tracker.snapshot().ending_ts == 300.0


def test_older_manifest_without_plan_or_ending_keeps_working(tmp_path):
    snap = scan(tmp_path / "o", {layout.MANIFEST_NAME: [run_record(3, plan=False), *rows(3)]})
    assert snap.layout == "hsmon" and snap.rows == 3 and snap.tokens == 30
    assert snap.rows_total is None and snap.ending is None and snap.run_seconds is None


def test_shards_are_done_only_when_every_manifest_is_and_plans_add_up(tmp_path):
    a, b = layout.manifest_name((0, 2)), layout.manifest_name((1, 2))
    half = scan(
        tmp_path / "h",
        {a: [run_record(2, (0, 2)), *rows(2), ending("done", 2)], b: [run_record(3, (1, 2)), *rows(1)]},
    )
    assert half.ending is None and half.rows_total == 5 and half.shards_missing == 0
    both = scan(
        tmp_path / "b",
        {
            a: [run_record(2, (0, 2)), ending("done", 2)],
            b: [run_record(3, (1, 2)), ending("done", 3, ts=250.0)],
        },
    )
    assert both.ending == "done" and both.ending_ts == 250.0
    alone = scan(tmp_path / "a", {a: [run_record(2, (0, 2)), ending("done", 2)]})
    assert alone.ending == "done" and alone.shards_missing == 1
    mixed = scan(
        tmp_path / "m",
        {a: [run_record(2, (0, 2)), ending("done", 2)], b: [run_record(3, (1, 2)), ending("stopped", 1)]},
    )
    assert mixed.ending == "stopped"

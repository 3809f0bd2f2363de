"""The following trainer's spool reader and replay window (trainer/window.py), on hand-written
manifests: a chunk only once its record is written, NaN/Inf rows left out, the held-out rule, the
end only when every shard is done; every row drawn exactly E times, rows leaving in order."""

from __future__ import annotations

import random

from hsmon.contracts import layout
from trainer.window import HeldOut, SpoolSource, Window

STATS_OK = {"final": [4, 1.0, 4, 0.0, 1.0, 1.0, 0]}
STATS_NAN = {"final": [4, 1.0, 4, 0.0, 1.0, 1.0, 3]}


def row(i: int, chunk: str, stats=STATS_OK, tokens: int = 20) -> dict:
    return {"type": "row", "row": i, "chunk": chunk, "tokens": tokens, "bytes": 100, "stats": stats}


def test_chunks_are_handed_over_whole_and_the_end_needs_every_shard(tmp_path):
    m0, m1 = tmp_path / layout.manifest_name((0, 2)), tmp_path / layout.manifest_name((1, 2))
    run = {"type": "run", "rows_total": 8, "settings": {"shard": [0, 2]}}
    layout.append_jsonl(m0, [run, row(0, "rows_0-4"), row(1, "rows_0-4", STATS_NAN)])
    source = SpoolSource(tmp_path, max_length=None, heldout=HeldOut(0.0, 0))
    assert source.poll() == [] and not source.ended()  # rows of an open chunk are not handed over
    layout.append_jsonl(m0, [row(2, "rows_0-4", tokens=1), {"type": "chunk", "chunk": "rows_0-4"},
                             {"type": "done"}])
    (chunk,) = source.poll()
    assert [r.row for r in chunk.train] == [0] and chunk.nonfinite == [1]  # row 2: one token, unusable
    assert chunk.train_bytes == 100
    assert not source.ended(), "shard 1 of 2 has no manifest yet"
    layout.append_jsonl(m1, [{**run, "settings": {"shard": [1, 2]}}, row(4, "rows_4-8"),
                             {"type": "chunk", "chunk": "rows_4-8"}])
    assert [c.name for c in source.poll()] == ["rows_4-8"] and not source.ended()
    layout.append_jsonl(m1, [{"type": "done"}])
    source.poll()
    assert source.ended() and source.plan_rows() == 16


def test_held_out_rule_is_fixed_and_capped():
    rule = HeldOut.new(0.5, max_rows=10)
    assert rule.below_row == 20 and HeldOut.from_record(rule.to_record()) == rule
    held = [i for i in range(1000) if rule.holds(i)]
    assert held and max(held) < 20


def test_every_row_is_drawn_exactly_e_times_and_rows_leave_in_order(tmp_path):
    source = SpoolSource(tmp_path, max_length=None, heldout=HeldOut(0.0, 0))
    records = [row(i, f"rows_{i // 8 * 8}-{i // 8 * 8 + 8}", tokens=10 + i % 7) for i in range(40)]
    chunks = [{"type": "chunk", "chunk": f"rows_{s}-{s + 8}"} for s in range(0, 40, 8)]
    layout.append_jsonl(tmp_path / layout.manifest_name(), [r for s in range(5) for r in
                                                            (*records[s * 8:s * 8 + 8], chunks[s])])
    window = Window(passes=3, size=12, done={0: 3, 1: 1})  # a resumed ledger: row 0 done, row 1 once
    for chunk in source.poll():
        window.add(chunk)
    rng, draws, finished_order = random.Random(0), 0, []
    while window.active:
        batches = window.draw(rng, batch_tokens=64, world=2)
        rows = [r.row for b in batches for r in b]
        assert len(rows) == len(set(rows)) and rows
        window.credit(rows)
        finished_order += [c.rows.name for c in window.finished_chunks() if c.rows.name not in finished_order]
        draws += 1
    assert window.passes == dict.fromkeys(range(40), 3)
    assert finished_order == [f"rows_{s}-{s + 8}" for s in range(0, 40, 8)]
    assert sum(window.take_pending().values()) == 40 * 3 - 3 - 1


def test_a_bounded_spool_settles_the_vocabulary_on_half_the_limit_not_on_the_first_chunk():
    from trainer.data import RowRef
    from trainer.follow_setup import Arrival, setup_sample
    from trainer.window import ChunkRows

    def chunk(i: int) -> ChunkRows:
        return ChunkRows(f"rows_{i}-{i + 1}", train=[RowRef(f"r{i}", i, 10)], train_bytes=100)

    one, two, empty = [chunk(0)], [chunk(0), chunk(1)], [ChunkRows("rows_5-6", nonfinite=[5])]
    # unbounded: the first usable chunk, as before
    assert setup_sample(one, Arrival([], False, 8, False)) is one[0]
    assert setup_sample(empty, Arrival([], False, 8, False)) is None
    # bounded: wait while the rows written hold less than half the limit and the extraction goes on
    assert setup_sample(one, Arrival([], False, 8, False, spool_limit=1000, row_bytes=100)) is None
    sample = setup_sample(two, Arrival([], False, 8, False, spool_limit=1000, row_bytes=500))
    assert sample is not None and [r.row for r in sample.train] == [0, 1]
    assert sample.name == "rows_0-1..rows_1-2"  # the start event's vocab_from names the span
    # an extraction that ended below half the limit: what there is
    assert setup_sample(one, Arrival([], True, 8, False, spool_limit=1000, row_bytes=100)) is one[0]


def test_the_step_budget_follows_the_rows_per_step_the_window_takes():
    """A set-up sample of long rows (one a batch) lays the schedule over twice the steps a stream of
    short rows (two a batch) takes: with the budget fixed at start the run ends with its learning
    rate far above the floor; re-estimated every step (trainer/follow_budget.py) it ends at it."""
    from trainer.data import RowRef
    from trainer.follow_budget import StepBudget
    from trainer.follow_setup import expected_training_rows
    from trainer.runtime import lr_lambda_factory
    from trainer.window import ChunkRows

    passes, rows, batch_tokens, floor = 2, 60, 64, 0.1
    initial = rows * passes  # one row a step, as a sample of 60-token rows in 64-token batches says
    expected = expected_training_rows(rows, HeldOut(0.0, 0))
    assert expected == rows
    budget = StepBudget(initial, 3, passes, expected, start_step=0)
    factor = budget.factor(floor)
    window, rng, step, arrived = Window(passes, size=12), random.Random(0), 0, 0
    while arrived < rows or window.active:
        if arrived < rows and len(window.active) < 12:  # the stream: short rows, two a batch
            window.add(ChunkRows(f"rows_{arrived}-{arrived + 2}",
                                 train=[RowRef(f"r{i}", i, 30) for i in (arrived, arrived + 1)]))
            arrived += 2
        drawn = [r.row for r in window.draw(rng, batch_tokens, 1)[0]]
        window.credit(drawn)
        step += 1
        budget.update(step, len(drawn), window, ended=arrived >= rows)
    assert rows * passes / step > 1.8  # about two rows a step: half the steps the sample promised
    fixed = lr_lambda_factory(initial, 3, floor)
    assert fixed(step - 1) > 3 * floor  # the budget of the start: far from the floor at the end
    assert abs(budget.total - step) <= 2
    assert factor(step - 1) < 1.2 * floor  # the budget kept true: at the floor at the end


def test_a_manifest_chunk_outside_the_layout_is_refused_with_its_line(tmp_path):
    """`../victim` as a chunk would send reads, and --consume's deletes, outside the spool."""
    import pytest

    from trainer.data import DataError, manifest_rows

    for bad, why in ((["../victim", 0], "is not a chunk directory"), (["rows_0-4\n", 0], "is not a chunk"),
                     (["rows_0-4", 9], "row 9 does not belong in chunk rows_0-4")):
        spool_dir = tmp_path / f"s{len(list(tmp_path.iterdir()))}"
        spool_dir.mkdir()
        chunk, index = bad
        records = [row(index, chunk), {"type": "chunk", "chunk": chunk}]
        layout.append_jsonl(spool_dir / layout.manifest_name(), records)
        source = SpoolSource(spool_dir, max_length=None, heldout=HeldOut(0.0, 0))
        with pytest.raises(DataError, match=why) as refused:
            source.poll()
        assert "hsmon-manifest.jsonl" in str(refused.value) and '"type": "row"' in str(refused.value)
        with pytest.raises(DataError, match=why):
            manifest_rows(spool_dir, None)

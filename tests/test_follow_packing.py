"""The following trainer's batch packing (trainer/packing.py) and its fairness in the replay window
(trainer/window.py): each batch is the densest the window allows around its anchor (checked against
every subset), fits the token budget, and no row waits more than a window's worth of batches."""

from __future__ import annotations

import itertools
import random

from hsmon.contracts import layout
from trainer.data import RowRef
from trainer.packing import Candidate, densest_batch, pack
from trainer.window import HeldOut, SpoolSource, Window


def cand(row: int, length: int, last: int = 0) -> Candidate:
    return Candidate(RowRef(f"r{row}", row, length), last, row)


def padded(batch: list) -> int:
    lengths = [c.ref.length if isinstance(c, Candidate) else c.length for c in batch]
    return max(lengths) * len(lengths)


def test_the_densest_batch_around_the_anchor_wins_not_the_nearest_lengths():
    anchor = cand(0, 30)
    others = [cand(1, 10), cand(2, 31), cand(3, 33), cand(4, 50)]
    batch = densest_batch(anchor, others, batch_tokens=100)
    # cap 33: 30 + 31 + 33 = 94 real tokens in 99 padded; cap 50 would give 80, cap 31 71
    assert sorted(c.ref.row for c in batch) == [0, 2, 3]
    assert batch[0] is anchor


def test_a_row_longer_than_the_budget_trains_alone():
    assert densest_batch(cand(0, 500), [cand(1, 10), cand(2, 20)], batch_tokens=256) == [cand(0, 500)]


def test_each_batch_is_the_best_subset_holding_its_anchor():
    rng = random.Random(3)
    for _ in range(150):
        budget = rng.choice([64, 100, 256])
        pool = [cand(i, rng.randint(2, 90)) for i in range(rng.randint(1, 8))]
        anchor, others = pool[0], pool[1:]
        batch = densest_batch(anchor, others, budget)
        assert batch[0] is anchor and len({c.ref.row for c in batch}) == len(batch)
        assert padded(batch) <= budget or len(batch) == 1
        best = anchor.ref.length
        for k in range(1, len(others) + 1):
            for subset in itertools.combinations(others, k):
                if padded([anchor, *subset]) <= budget:
                    best = max(best, anchor.ref.length + sum(c.ref.length for c in subset))
        assert sum(c.ref.length for c in batch) == best, (budget, pool)


def test_pack_anchors_each_rank_on_the_longest_waiting_row_and_never_repeats_a_row():
    rows = [cand(0, 40, last=5), cand(1, 12, last=1), cand(2, 12, last=1), cand(3, 41, last=0),
            cand(4, 11, last=3)]
    first, second, third = pack(rows, batch_tokens=48, batches=3)
    assert [r.row for r in first] == [3]  # waited longest (last=0); nothing else fits beside 41
    assert sorted(r.row for r in second) == [1, 2, 4]  # row 1 next (last=1, earlier arrival than 2)
    assert [r.row for r in third] == [0]
    assert pack([], batch_tokens=48, batches=2) == [[], []]


def test_no_row_waits_more_than_a_window_of_batches_whatever_its_length(tmp_path):
    """Lengths from 3 to 60 tokens with a 64-token budget: the old random anchor left rows of
    awkward lengths behind; here every row is drawn at least once every `size` batches, and every
    row exactly E times."""
    rng = random.Random(1)
    stats = {"final": [4, 1.0, 4, 0.0, 1, 1, 0]}
    records = [{"type": "row", "row": i, "chunk": f"rows_{i // 6 * 6}-{i // 6 * 6 + 6}", "bytes": 1,
                "tokens": rng.choice([3, 5, 8, 21, 33, 40, 60]), "stats": stats} for i in range(36)]
    lines = []
    for start in range(0, 36, 6):
        lines += [*records[start:start + 6], {"type": "chunk", "chunk": f"rows_{start}-{start + 6}"}]
    layout.append_jsonl(tmp_path / layout.manifest_name(), lines)
    size, passes = 10, 4
    window = Window(passes=passes, size=size)
    for chunk in SpoolSource(tmp_path, max_length=None, heldout=HeldOut(0.0, 0)).poll():
        window.add(chunk)
    seen_at: dict[int, list[int]] = {}
    entered = {r.row: 0 for r in window.active}
    batch_no = 0
    while window.active:
        for row in [r.row for r in window.active]:
            entered.setdefault(row, batch_no)
        (batch,) = window.draw(batch_tokens=64, world=1)
        assert batch and padded(batch) <= 64
        for ref in batch:
            seen_at.setdefault(ref.row, []).append(batch_no)
        window.credit([r.row for r in batch])
        batch_no += 1
    assert window.passes == dict.fromkeys(range(36), passes)
    for row, times in seen_at.items():
        gaps = [b - a for a, b in zip([entered[row], *times[:-1]], times, strict=True)]
        assert max(gaps) <= size, (row, gaps)

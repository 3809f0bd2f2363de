"""The ETA model (hsmon/core/eta.py) on synthetic sequences: rows of varying lengths, a rate
change, a pause, a restart; and the tracker's progress section carrying its range."""

from __future__ import annotations

import random

from hsmon.core.eta import EtaModel, job_eta


def _feed(model: EtaModel, t: float, work: float, steps: int, dt: float, per_step) -> tuple[float, float]:
    for _ in range(steps):
        t += dt
        work += per_step()
        model.add(t, work)
    return t, work


def test_tokens_not_rows_when_rows_vary_in_length() -> None:
    # a job whose first rows are short and later rows long: 1000 tokens/s all along, but the row
    # rate halves; planned by tokens the ETA is right from the start, by rows it would be 2x off
    rng = random.Random(1)
    rows, toks = EtaModel(), EtaModel()
    t, r, k = 0.0, 0, 0
    for i in range(600):  # 600 s
        length = rng.randint(50, 150) if i < 300 else rng.randint(150, 250)  # tokens of the row
        t += length / 1000.0 * 1.0
        r, k = r + 1, k + length
        rows.add(t, r)
        toks.add(t, k)
    # 500 rows left, short ones again (~100 tokens): 50 s at 1000 tokens/s; the recent row rate
    # (5-10 rows/s) says far more
    tokens_total = k + 50_000
    got = job_eta(rows, toks, r, r + 500, k, tokens_total)
    assert got is not None and abs(got.eta_s - 50.0) < 5.0, got
    assert got.low_s <= got.eta_s <= got.high_s
    by_rows = job_eta(rows, toks, r, r + 500, k, None)  # no token plan: rows
    assert by_rows is not None and by_rows.eta_s > 1.3 * got.eta_s, by_rows  # rows: well off


def test_rate_change_is_followed_within_minutes() -> None:
    m = EtaModel()
    t, w = _feed(m, 0.0, 0.0, 3600, 1.0, lambda: 10.0)  # an hour at 10/s
    assert abs(m.estimate(10_000).eta_s - 1000) < 20
    t, w = _feed(m, t, w, 900, 1.0, lambda: 20.0)  # then 15 min at 20/s
    assert abs(m.estimate(10_000).eta_s - 500) < 50  # the long first hour does not hold it back


def test_pause_neither_infinity_nor_zero() -> None:
    m = EtaModel()
    t, w = _feed(m, 0.0, 0.0, 300, 1.0, lambda: 5.0)
    before = m.estimate(5000).eta_s
    assert abs(before - 1000) < 20
    assert m.estimate(5000).eta_s == before  # no new sample (paused): the ETA holds
    m.add(t + 3600.0, w + 5.0)  # an hour's pause, then work again
    t, w = _feed(m, t + 3600.0, w + 5.0, 30, 1.0, lambda: 5.0)
    after = m.estimate(5000).eta_s
    assert abs(after - before) < 0.05 * before, (before, after)


def test_range_wide_when_noisy_narrow_when_steady() -> None:
    steady, noisy = EtaModel(), EtaModel()
    rng = random.Random(2)
    _feed(steady, 0.0, 0.0, 600, 1.0, lambda: 10.0)
    _feed(noisy, 0.0, 0.0, 600, 1.0, lambda: rng.choice((0.0, 0.0, 10.0, 30.0)))
    s, n = steady.estimate(6000), noisy.estimate(6000)
    assert s.high_s - s.low_s < 0.01 * s.eta_s
    assert n.high_s - n.low_s > 0.05 * n.eta_s
    assert n.low_s < n.eta_s < n.high_s


def test_restart_and_no_rate() -> None:
    m = EtaModel()
    assert m.estimate(100) is None
    _feed(m, 0.0, 0.0, 100, 1.0, lambda: 1.0)
    m.add(200.0, 0.0)  # counter went back: start over
    assert m.estimate(100) is None
    assert job_eta(EtaModel(), EtaModel(), 0, None, 0, None) is None


def test_tracker_plans_by_tokens_and_status_shows_the_range(tmp_path) -> None:
    import json

    from hsmon.contracts.units import format_duration
    from hsmon.core.trackers.progress import ProgressTracker
    from hsmon.status.text import eta_text

    path = tmp_path / "events.jsonl"
    rng = random.Random(3)
    start = {"v": 1, "ts": 0.0, "job": "j", "kind": "start", "rows_total": 10_000, "tokens_total": 2_000_000}
    lines = [start]
    t, rows, toks = 0.0, 0, 0
    for _ in range(600):  # rows of 20..380 tokens, about 100 tokens/s with bursts
        length = rng.randint(20, 380)
        t += length / 100.0 * rng.choice((0.3, 1.0, 1.7))
        rows, toks = rows + 1, toks + length
        lines.append({"v": 1, "ts": t, "job": "j", "kind": "rows", "rows": 1, "tokens": length})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    tracker = ProgressTracker(str(path))
    tracker.poll()
    prog = tracker.snapshot(t).progress
    want = (2_000_000 - toks) / 100.0  # tokens left at ~100 tokens/s
    assert prog.eta_low_s <= prog.eta_s <= prog.eta_high_s
    assert prog.eta_low_s < want * 1.3 and prog.eta_high_s > want * 0.7, (prog, want)
    shown = eta_text(prog, prog.eta_s, format_duration)
    assert "–" in shown and shown.split("–")[0] == format_duration(prog.eta_low_s)

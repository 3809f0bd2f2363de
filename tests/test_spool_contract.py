"""The spool contract (hsmon.contracts.spool): the ledger's totals, its voided passes after a lost
checkpoint."""

from __future__ import annotations

from hsmon.contracts import layout, spool, spool_fill


def _append(out, *records):
    layout.append_jsonl(spool.ledger_path(out), records)


def test_ledger_totals_and_voided_passes_after_a_lost_checkpoint(tmp_path):
    _append(tmp_path, {"type": "start", "ts": 1.0, "pid": 11, "passes": 2, "consume": True, "step": 0},
            {"type": "trained", "ts": 2.0, "step": 10, "rows": {"0": 1, "1": 2}},
            {"type": "consumed", "ts": 2.5, "chunk": "rows_0-2", "rows": 2, "bytes": 300},
            {"type": "trained", "ts": 3.0, "step": 20, "rows": {"2": 1}})
    reader = spool.LedgerReader(tmp_path)
    ledger = reader.poll()
    assert ledger.passes == {0: 1, 1: 2, 2: 1} and ledger.step == 20
    assert (ledger.consumed_rows, ledger.consumed_bytes) == (2, 300)
    assert (ledger.passes_target, ledger.trainer_pid) == (2, 11)
    # the trainer was killed after the ledger's step-20 record, before the step-20 checkpoint
    _append(tmp_path, {"type": "start", "ts": 4.0, "pid": 12, "passes": 2, "consume": True, "step": 10})
    ledger = reader.poll()
    assert ledger.passes == {0: 1, 1: 2, 2: 0} and ledger.step == 10 and ledger.trainer_pid == 12
    assert ledger.ended is None
    _append(tmp_path, {"type": "done", "ts": 5.0, "step": 30})
    assert reader.poll().ended == "done"
    assert spool_fill.ledger_level(1000, 10, ledger, None).waiting_bytes == 700


def test_monitor_reader_keeps_no_row_counts_and_a_spool_reads_its_limit(tmp_path):
    _append(tmp_path, {"type": "start", "ts": 1.0, "pid": 1, "passes": 1, "step": 0},
            {"type": "trained", "ts": 2.0, "step": 5, "rows": {str(i): 1 for i in range(100)}})
    ledger = spool.LedgerReader(tmp_path, track_passes=False).poll()
    assert ledger.passes == {} and ledger.step == 5
    assert spool.read_spool_limit(tmp_path) is None
    spool.write_spool_limit(tmp_path, 20_000_000_000)
    assert spool.read_spool_limit(tmp_path) == 20_000_000_000


def test_a_kill_inside_a_save_at_the_checkpoints_own_step_voids_that_save_by_its_number(tmp_path):
    """The final save writes the passes of skipped steps at the step already checkpointed, then that
    checkpoint again: killed between the two, the resume (its checkpoint's save number 1) counts
    the passes of save 1 only, so the ledger and the checkpoint agree."""
    _append(tmp_path, {"type": "start", "ts": 1.0, "passes": 2, "consume": True, "step": 0, "save": 0},
            {"type": "trained", "ts": 2.0, "step": 4, "save": 1, "rows": {"0": 1, "1": 1}},
            {"type": "trained", "ts": 3.0, "step": 4, "save": 2, "rows": {"2": 1}},
            {"type": "stopped", "ts": 3.5, "step": 4, "reason": "max_steps"})
    ledger = spool.read_ledger(tmp_path)
    assert ledger.ended_reason == "max_steps" and ledger.trained_since_start == 2
    _append(tmp_path, {"type": "start", "ts": 4.0, "passes": 2, "consume": True, "step": 4, "save": 1,
                       "out": "/o"})
    ledger = spool.read_ledger(tmp_path)
    assert {r: n for r, n in ledger.passes.items() if n} == {0: 1, 1: 1}
    assert (ledger.start_step, ledger.trained_since_start, ledger.out, ledger.ended) == (4, 0, "/o", None)

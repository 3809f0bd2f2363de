"""What the dashboard prints, without a terminal: one human line per event kind, numbers with at
most 4 significant digits, no ETA for a finished job, long paths cut in their middle, the history
of a finished job kept (hsmon/tui/event_text.py, numbers.py, view.py)."""

from __future__ import annotations

import pytest
import tui_run_documents as run
from tui_complete import typed, typed_job
from tui_screen_text import long_floats

from hsmon.status_doc.numbers import fmt_count, fmt_num, fmt_pct_of, shorten_path
from hsmon.tui import view
from hsmon.tui.event_text import event_detail, event_summary


def ev(kind: str, **fields: object) -> dict[str, object]:
    return {"v": 1, "ts": 100.0, "job": "j", "kind": kind, **fields}


# Each kind as the extractor (extractor/run.py, writer.py), the trainer (trainer/train.py),
# `hsmon eval-drafter` and the monitor (state) write it, with the line a person reads.
SUMMARIES = [
    (
        ev(
            "start",
            rows_total=300,
            tokens_total=34662,
            rows_done=0,
            chunks_total=3,
            backend="hf",
            out_dir="/tmp/nc/demo-out/extract",
            pid=1,
            layers=[2, 4],
        ),
        "start: 300 rows, 34.7k tok, 3 chunks, hf → /tmp/nc/demo-out/extract",
    ),
    (
        ev(
            "start",
            backend="train",
            total_rows=284,
            eval_rows=16,
            total_steps=76,
            ttt_length=7,
            output_dir="/d/drafter",
        ),
        "start training: 284 rows (+16 held out), 76 steps, unroll 7 → /d/drafter",
    ),
    (
        ev("start", backend="train", total_rows=284, total_steps=76, ttt_length=7, arch="eagle3.1"),
        "start training: 284 rows, 76 steps, unroll 7, arch eagle3.1",
    ),
    (
        ev("start", backend="eval-drafter", prompts=4, depth=7, rows_total=60, drafter="/d/drafter"),
        "start eval-drafter: 4 prompts, depths 1..7, 60 decodes, drafter /d/drafter",
    ),
    (
        ev(
            "rows",
            rows=15,
            tokens=2157,
            last_row=255,
            rows_done=256,
            rows_total=300,
            tokens_done=29247,
            tokens_total=34662,
            bytes_done=61_000_000,
        ),
        "rows 256/300 (+15, 2,157 tok)",
    ),
    (ev("row", row=12, tokens=2100), "row 12 (2,100 tok)"),
    (
        ev("chunk", chunk="rows_100-200", rows=100, tokens=11554, bytes=29_700_000, rejects=0, sha256="ab"),
        "chunk rows_100-200 closed: 100 rows, 11.6k tok, 29.7 MB",
    ),
    (ev("heartbeat", rows_done=120, rows_total=300, tokens_done=1, paused=None), "heartbeat: 120/300 rows"),
    (ev("heartbeat", step=12, tokens=34000, epoch=0), "heartbeat: step 12, 34.0k tok"),
    (
        ev("pause", reason="disk", free_bytes=1.2e9, need_bytes=2e9, min_free_bytes=1e8, path="/data/out"),
        "paused (disk): 1.2 GB free, needs 2.0 GB, /data/out",
    ),
    (
        ev("resume", reason="disk", free_bytes=3.4e9, paused_seconds=12.345678),
        "resumed (disk) after 12s, 3.4 GB free",
    ),
    (ev("reject", row=2101, line=2102, reason="empty text"), "reject row 2101: empty text"),
    (ev("retry", row=2200, attempt=1, error="server 503"), "retry row 2200 (attempt 1): server 503"),
    (
        ev("error", message="cannot load the model: no config.json"),
        "error: cannot load the model: no config.json",
    ),
    (
        ev(
            "done",
            seconds=11.482913,
            out_dir="/o",
            rows_done=300,
            rows_total=300,
            tokens_done=34662,
            bytes_done=72_200_000,
        ),
        "done: 300/300 rows, 34.7k tok, 72.2 MB in 11s",
    ),
    (
        ev(
            "done",
            step=74,
            tokens=128617,
            epochs_done=3,
            time_limit_reached=True,
            eval_accs=[0.26489531993865967],
        ),
        "done: step 74, 128.6k tok, time limit reached, held-out acc 26.5% (pos 0)",
    ),
    (
        ev(
            "done",
            seconds=23.2,
            acceptance_length={"eagle3": {"1": 1.5, "7": 2.3770491803}, "ngram": {"1": 1.8, "7": 4.884615}},
        ),
        "done: acceptance at depth 7: drafter 2.377, n-gram 4.885 tok/forward in 23s",
    ),
    (
        ev("stopped", reason="signal", seconds=3.0, rows_done=120, rows_total=300),
        "stopped (signal) at 120/300 rows",
    ),
    (ev("stopped", reason="signal", step=40, tokens=9000), "stopped (signal) at step 40"),
    (
        ev("state", state="done", previous="running", reason="the job reported done"),
        "state running → done: the job reported done",
    ),
    (
        ev(
            "step",
            step=29,
            total_steps=76,
            epoch=1,
            loss=21.812345678,
            losses=[5.4],
            accs=[0.26489531993865967],
            lr=0.002,
            grad_norm=1.2,
            tokens=50000,
            tokens_s=2123.456789,
            data_wait_frac=0.01,
        ),
        "step 29/76: loss 5.400, acc 26.5% (pos 0), 2,123 tok/s",
    ),
    (
        ev("checkpoint", step=40, path="/tmp/nc/demo-out/drafter/checkpoint-40", epoch=0),
        "checkpoint at step 40 → /tmp/nc/…/drafter/checkpoint-40",
    ),
    (
        ev(
            "eval",
            step=74,
            rows=16,
            losses=[5.443658351898193, 5.485819339752197],
            accs=[0.26489531993865967, 0.22093217372894287],
            loss=21.76,
            accept_len_est=1.3370041847229004,
        ),
        "eval at step 74: 16 held-out rows, acc 26.5% 22.1%, est. acceptance 1.337",
    ),
]


@pytest.mark.parametrize(
    ("event", "line"), SUMMARIES, ids=[f"{e['kind']}-{i}" for i, (e, _) in enumerate(SUMMARIES)]
)
def test_every_kind_has_a_human_summary(event: dict[str, object], line: str) -> None:
    assert event_summary(event) == line
    assert not long_floats([line])


def test_unknown_kinds_and_odd_fields_keep_the_raw_form() -> None:
    assert event_summary(ev("gpu-temp", celsius=71.23456789, card=3)) == "gpu-temp celsius=71.23 card=3"
    # a writer's odd types do not break the log: the raw form instead of an exception
    assert event_summary(ev("rows", rows="many", rows_done=[1])).startswith("rows rows=many")
    detail = event_detail(ev("rows", rows=15, rows_done=256, rows_total=300), 103.0)
    assert "rows event of j at 00:01:40, 3s ago" in detail  # its clock time and its age
    assert '"rows_done": 256' in detail  # every field, whole


def test_numbers_have_at_most_four_significant_digits() -> None:
    assert fmt_num(5.443658351898193) == "5.444"
    assert fmt_num(0.26489531993865967) == "0.2649"
    assert fmt_num(21.76) == "21.76" and fmt_num(1234.5678) == "1,235" and fmt_num(9.99961) == "10.00"
    assert fmt_num(None) == "-" and fmt_num(0) == "0" and fmt_num(0.0001234567) == "1.23e-04"
    assert (
        fmt_pct_of(0.26489531993865967) == "26.5%"
        and fmt_pct_of(0.0412) == "4.12%"
        and fmt_pct_of(1) == "100%"
    )
    assert fmt_count(34662) == "34.7k" and fmt_count(2157) == "2,157" and fmt_count(123_456_789) == "123.5M"
    for value in (3.14159265, 123456.789, 0.000987654, 98765.4321, 1e12 / 7):
        assert not long_floats([fmt_num(value), fmt_count(value)]), value


def test_a_finished_job_has_no_eta_and_keeps_its_history() -> None:
    docs = run.finished_extraction()
    history = view.JobHistory()
    for doc in docs:
        history.add(typed(doc).jobs[0], doc["generated_ts"])
    done = docs[-1]["jobs"][0]
    typed_done = typed_job(done)
    assert done["state"] == "done" and done["progress"]["eta_s"] == 0.0
    assert view.job_elapsed_eta(typed_done) == ("12s", "-") and view.job_eta_s(typed_done) is None
    assert "ETA" not in view.status_line(typed_done)
    training = run.training()  # its training section keeps a stale estimate
    assert training["training"]["eta_s"] > 1 and view.job_eta_s(typed_job(training)) is None
    # rates fell to 0 once done; the history still holds the run, not a flat line of zeros
    assert history.rows_per_s.added == run.RUN_SECONDS and min(history.rows_per_s) > 20
    assert history.finished
    averages = view.final_averages(typed_done)
    assert averages["rows"] == pytest.approx(300 / 12.123456) and averages["bytes"] == pytest.approx(
        72_000_000 / 12.123456
    )
    # the log keeps every event it saw, beyond the 20 a document carries
    assert len(history.events) > 20 and history.events == sorted(history.events, key=lambda e: e["ts"])
    running = view.JobHistory()
    running.add(typed(docs[3]).jobs[0], docs[3]["generated_ts"])
    assert not running.finished and view.job_eta_s(typed(docs[3]).jobs[0]) is not None


def test_long_paths_are_cut_in_the_middle() -> None:
    path = "/tmp/nc/demo-out/extract"
    assert shorten_path(path, 40) == path
    assert shorten_path(path, 20) == "/tmp/nc/…/extract"
    assert shorten_path(path, 12) == "/…/extract"
    assert shorten_path("/data/a-very-long-file-name.ckpt", 12) == "…e-name.ckpt"
    for width in range(2, 30):
        cut = shorten_path(run.OUT, width)
        assert len(cut) <= width, (width, cut)
        if width >= len("/…/extract"):
            assert cut.endswith("/extract")


def test_eval_and_acceptance_read_as_tables() -> None:
    lines = view.eval_lines(run.training()["training"]["eval"])
    assert lines[0] == "held-out eval at step 74 (16 rows)"
    assert lines[1].split() == ["acc", "26.5%", "22.1%", "20.3%", "19.4%", "20.1%", "19.2%", "19.0%"]
    assert lines[2].split()[:3] == ["loss", "5.444", "5.486"]
    assert "est. acceptance length 1.337" in lines[3]
    job = typed_job(run.acceptance(24))
    assert view.is_acceptance_job(job) and not view.is_acceptance_job(typed_job(run.training()))
    table = view.acceptance_lines(view.acceptance_result(job))
    assert table[2].split() == ["depth", "1", "2", "3", "4", "5", "6", "7"]
    assert table[3].split()[:2] == ["drafter", "1.556"] and table[4].split()[-1] == "4.885"
    assert not long_floats(lines + table)
    running = typed_job(run.acceptance(10, done=False))
    assert view.is_acceptance_job(running) and "decodes 25 / 60" in view.status_line(running)

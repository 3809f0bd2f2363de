"""The TUI's pure arithmetic and wording (hsmon/tui/view.py), no terminal involved."""

from __future__ import annotations

import time

from tui_complete import typed, typed_job
from tui_documents import document, extraction_job, training_job

from hsmon.tui import view
from hsmon.tui.widgets.unroll_plot import sparkline


def test_progress_label_and_fraction() -> None:
    assert view.progress_label(250, 1000) == "250 / 1,000 (25.0%)"
    assert view.progress_label(5, None) == "5 / ?"
    assert view.fraction(5, 0) is None
    assert view.fraction(20, 10) == 1.0


def test_disk_verdicts() -> None:
    lines = view.disk_lines(typed_job(extraction_job()).disk)
    assert [(line.role, line.verdict) for line in lines] == [
        ("output", "fills before done"),
        ("shm", "WILL NOT FIT"),
    ]
    assert lines[1].free == "2.0 GB"
    ok = {
        "role": "output",
        "path": "/d",
        "free_bytes": 1e12,
        "needed_bytes": 1e9,
        "fits": True,
        "time_to_full_s": 9e4,
        "time_to_done_s": 10.0,
    }
    assert view.disk_lines(typed_job(dict(extraction_job(), disk=[ok])).disk)[0].verdict == "fits"


def test_alerts_carry_hints_disk_and_bad_states() -> None:
    job = extraction_job()
    messages = [message for _, message in view.alerts(typed_job(job))]
    assert any("PYTHONUNBUFFERED" in m for m in messages)
    assert any("WILL NOT FIT" in m for m in messages)
    job["state"], job["reason"] = "stalled", "nothing moved for 300s"
    assert view.alerts(typed_job(job))[0] == ("critical", "stalled: nothing moved for 300s")


def test_event_filters() -> None:
    events = extraction_job()["recent_events"]
    assert [e["kind"] for e in view.filtered_events(events, "rejects", 10)] == ["reject", "reject"]
    assert [e["kind"] for e in view.filtered_events(events, "errors", 10)] == ["retry"]
    assert len(view.filtered_events(events, "all", 3)) == 3
    line = view.event_line(events[-1])
    stamp = time.strftime("%H:%M:%S", time.localtime(events[-1]["ts"]))
    assert line == f"{stamp} reject row 2417: too long"  # the clock time, not only an age
    # search: the lines that hold the text, whatever its case, the clock time included
    assert [e["row"] for e in view.filtered_events(events, "all", 10, search="ROW 2417")] == [2417]
    assert view.filtered_events(events, "all", 10, search=stamp)[-1] is events[-1]
    assert view.filtered_events(events, "errors", 10, search="too long") == []
    heartbeat = {"v": 1, "ts": 1.0, "job": "x", "kind": "heartbeat", "rows_done": 3}
    assert not view.filtered_events([heartbeat], "all", 10)  # hidden by default
    assert view.filtered_events([heartbeat], "+heartbeats", 10) == [heartbeat]


def test_training_defaults_from_the_extraction() -> None:
    defaults = view.training_defaults(typed_job(extraction_job()))
    assert defaults["data_dir"] == "/data/out"
    assert defaults["out_dir"] == "/data/out-drafter"
    assert defaults["target_model"] == "/models/target"
    assert view.training_defaults(None)["data_dir"] == ""


def test_extraction_unfinished() -> None:
    job = extraction_job()
    assert view.extraction_unfinished(typed_job(job))
    job["progress"]["chunks_done"] = 5
    assert not view.extraction_unfinished(typed_job(job))
    assert not view.extraction_unfinished(typed_job(training_job()))


def test_history_ignores_repeated_documents_and_tracks_unroll_steps() -> None:
    history = view.JobHistory()
    for step in (0, 0, 1, 2):
        doc = document(step)
        history.add(typed(doc).jobs[1], doc["generated_ts"])
    assert history.rows_per_s.added == 3
    series = [[value for _step, value in s.readings()] for s in history.unroll.loss]
    assert len(series) == 7 and len(series[0]) == 3
    assert series[0][0] > series[0][-1]  # the fixture's loss falls
    assert history.unroll.loss[0].span == (40.0, 60.0)  # along the optimizer's steps


def test_sparkline_scales() -> None:
    assert sparkline([0, 1], 10) == "▁█"
    assert sparkline([5, 5, 5], 2) == "▅▅"
    assert sparkline([], 5) == ""
    assert len(sparkline(list(range(100)), 8)) == 8


def test_the_tui_never_imports_torch_or_transformers() -> None:
    import subprocess
    import sys

    code = (
        "import sys, hsmon.tui.app, hsmon.tui.cli, hsmon.tui.sources, hsmon.demo\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'sglang')]\n"
        "print(heavy)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_alerts_do_not_repeat_what_the_monitors_hints_say() -> None:
    job = extraction_job()
    job["hints"].append({"id": "shm-full-soon", "severity": "critical", "message": "/dev/shm fills in 23m"})
    messages = [message for _, message in view.alerts(typed_job(job))]
    assert "/dev/shm fills in 23m" in messages
    assert not any(m.startswith("disk shm") for m in messages)  # said once, by the hint
    assert any(m.startswith("disk output") for m in messages)  # no hint for the output: ours stays
    job["state"] = "stalled"
    job["hints"].append({"id": "stalled", "severity": "critical", "message": "nothing moved for 300s"})
    assert not any(m.startswith("stalled:") for m in (message for _, message in view.alerts(typed_job(job))))


def test_cli_bad_input_gives_one_clear_line() -> None:
    import subprocess
    import sys

    cases = {
        ("--url", "localhost:9108"): "--url localhost:9108: give a full URL",
        ("--url", "http://127.0.0.1:1", "--refresh", "0"): "--refresh 0.0: must be a positive number",
        ("--status-file", "/nonexistent/status.json"): "--status-file /nonexistent/status.json:",
        (
            "--url",
            "http://127.0.0.1:1",
            "--token-file",
            "/nonexistent/token",
        ): "--token-file /nonexistent/token:",
    }
    for args, expected in cases.items():
        result = subprocess.run([sys.executable, "-m", "hsmon", "tui", *args], capture_output=True, text=True)
        assert result.returncode == 2, (args, result.stderr)
        assert expected in result.stderr and len(result.stderr.strip().splitlines()) == 1, (
            args,
            result.stderr,
        )


def test_status_line_shows_rows_for_an_extraction_and_steps_for_a_training() -> None:
    extraction = view.status_line(typed_job(extraction_job()))
    assert "rows " in extraction and "step " not in extraction
    job = training_job(2)
    job["progress"].update(rows_done=0, rows_total=284)  # the data a training was started on
    job["training"]["total_steps"] = 200
    line = view.status_line(typed_job(job))
    assert "rows " not in line
    assert "step 60 / 200 (30.0%)" in line and "loss 1.900" in line


def test_rate_history_from_a_big_events_file_reads_a_bounded_sample(tmp_path) -> None:
    import pytest

    from hsmon.tui.backfill import WINDOW_BYTES, events_rate_history

    path = tmp_path / "events.jsonl"
    with open(path, "w") as fh:  # 100 rows/s for 400 s, then 10 rows/s: ~3.5 MB
        for i in range(44_000):
            ts = 1000.0 + (i / 100 if i < 40_000 else 400 + (i - 40_000) / 10)
            fh.write(f'{{"v":1,"ts":{ts},"job":"x","kind":"rows","rows_done":{i + 1},'
                     f'"tokens_done":{(i + 1) * 7},"pad":"{"x" * 40}"}}\n')
    assert path.stat().st_size > 61 * WINDOW_BYTES  # a sample, not the whole file, is read
    series = events_rate_history(str(path), 60)
    assert series is not None and len(series.rows_per_s) == 60
    assert series.rows_per_s[0][1] == pytest.approx(100, rel=0.02)
    assert series.rows_per_s[-1][1] == pytest.approx(10, rel=0.02)
    assert series.rows_per_s[-1][0] == pytest.approx(1000 + 400 + 400, abs=1)  # the last reading's time
    assert series.tokens_per_s[0][1] == pytest.approx(700, rel=0.02) and series.bytes_per_s == []


def test_event_log_lines_are_the_segments_rich_would_render() -> None:
    """The log draws its lines directly (they are drawn again every second); the result must be
    what rich's Text gives, segment for segment (the snapshots compare segments)."""
    from rich.console import Console
    from rich.style import Style
    from rich.text import Text
    from textual.strip import Strip

    from hsmon.tui.widgets.event_log import KIND_STYLES, line_strip

    base = Style.parse("#e0e0e0 on #121212")
    console = Console()
    for name in [*KIND_STYLES.values(), "", "dim"]:
        for plain in ("    now rows 256/300 (+15, 2,157 tok)", "  -4m05s chunk closed: ✓ 100 rows 中文", "x"):
            for width in (1, 8, 20, 60):
                for highlighted in (False, True):
                    text = Text(plain)
                    text.stylize(name)
                    text.truncate(width, overflow="ellipsis")
                    if highlighted:
                        text.stylize("reverse")
                    want = Strip(text.render(console), text.cell_len).extend_cell_length(width, base)
                    got = line_strip(plain, name, highlighted, width, base)
                    assert list(got) == list(want.apply_style(base)), (name, plain, width, highlighted)


def test_plurals_agree_with_their_number() -> None:
    from hsmon.status_doc.numbers import counted

    assert [counted(n, "chunk") for n in (0, 1, 2, 34_662)] == ["0 chunks", "1 chunk", "2 chunks",
                                                                 "34.7k chunks"]
    chunk = {"kind": "chunk", "chunk": "rows_0-1", "rows": 1}
    assert view.event_summary(chunk) == "chunk rows_0-1 closed: 1 row"
    start = {"kind": "start", "rows_total": 1, "chunks_total": 1}
    assert view.event_summary(start) == "start: 1 row, 1 chunk"

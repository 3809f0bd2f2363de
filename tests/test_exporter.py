"""The exporter in-process: every metric it can produce is documented in docs/metrics.md."""

from __future__ import annotations

import re
import subprocess
import sys

from daemon_helpers import REPO, STORY, child_env

from hsmon.core.config import JobConfig
from hsmon.core.monitor import Monitor
from hsmon.daemon.notify import Notifier
from hsmon.metrics.exporter import MetricsEndpoint


def test_every_exported_metric_is_documented(tmp_path):
    """docs/metrics.md names every metric the exporter can produce (all sections populated)."""
    events = tmp_path / "e.jsonl"
    subprocess.run(
        [
            sys.executable,
            STORY,
            str(tmp_path / "d"),
            str(tmp_path / "o"),
            "--rows",
            "3",
            "--delay",
            "0",
            "--events",
            str(events),
            "--manifest",
        ],
        check=True,
        timeout=60,
        stdout=subprocess.DEVNULL,
        env=child_env(),
    )
    with open(events, "a") as fh:
        fh.write('{"v":1,"ts":1,"job":"s","kind":"step","step":1,"losses":[1.0],"accs":[0.5]}\n')
    regen = tmp_path / "regen"  # a regeneration's output: its own families
    regen.mkdir()
    (regen / "hsmon-regenerate.jsonl").write_text(
        '{"type":"run","settings":{},"rows_total":2}\n'
        '{"type":"row","row":0,"line":1,"end":10,"turns":[{"finish":"stop","tokens":7,"source_tokens":9}]}\n')
    monitor = Monitor(
        [
            JobConfig(
                name="s", dump_dir=str(tmp_path / "d"), out_dir=str(tmp_path / "o"), events=str(events), pid=1
            ),
            JobConfig(name="r", out_dir=str(regen)),
        ],
        use_watchdog=False,
    )
    monitor.tick(force_scan=True)
    metrics = MetricsEndpoint(monitor, Notifier("http://127.0.0.1:9/"))
    names = set(re.findall(r"^# TYPE (\S+)", metrics.render().decode(), re.M))
    with open(REPO / "docs" / "metrics.md") as fh:
        documented = set(re.findall(r"`(hsmon_[a-z0-9_]+)`", fh.read()))
    assert len(names) > 50
    assert names - documented == set()
    assert {n for n in documented if not n.startswith("hsmon_job_state{")} - names == set()


def test_monitor_side_imports_no_torch_transformers_or_sglang(tmp_path):
    code = (
        "import sys, io, contextlib\n"
        "import hsmon.daemon, hsmon.core.monitor, hsmon.status.cli, hsmon.launch.training\n"
        "import hsmon.daemon.notify\n"
        "import hsmon.metrics.exporter\n"
        "import hsmon.core.watch, hsmon.core.trackers.processes\n"
        "from hsmon.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    main(['status', '--out', {str(tmp_path)!r}, '--sample', '0', '--json'])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'sglang'))\n"
        "print(heavy)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


def test_rejects_by_reason_reach_the_status_document_and_the_metric(tmp_path):
    """A run's events (as hsmon extract writes them) -> the progress section -> the counter."""
    from hsmon.contracts import events as ev

    events = tmp_path / "e.jsonl"
    with ev.EventWriter("x", events) as w:
        w.emit(ev.START, rows_total=10, rejects=1, rejects_by_reason={"out_of_vocabulary": 1})
        w.emit(ev.REJECT, row=4, line=5, reason="refused by the server (HTTP 400 from http://s): The input "
               "(512 tokens) is longer than the model's context length (512 tokens).")
    monitor = Monitor([JobConfig(name="x", events=str(events))], use_watchdog=False)
    monitor.tick(force_scan=True)
    (job,) = monitor.status_document()["jobs"]
    assert job["progress"]["rejects"] == 2
    assert job["progress"]["rejects_by_reason"] == {"out_of_vocabulary": 1, "server_too_long": 1}
    text = MetricsEndpoint(monitor, Notifier("http://127.0.0.1:9/")).render().decode()
    assert 'hsmon_rows_rejected_total{job="x",reason="server_too_long"} 1.0' in text
    assert 'hsmon_rows_rejected_total{job="x",reason="out_of_vocabulary"} 1.0' in text
    with ev.EventWriter("x", events) as w:  # a heartbeat carries the run's own count
        w.emit(ev.HEARTBEAT, rejects=3, rejects_by_reason={"out_of_vocabulary": 1, "server_too_long": 2})
    monitor.tick(force_scan=True)
    assert monitor.status_document()["jobs"][0]["progress"]["rejects_by_reason"]["server_too_long"] == 2


def test_a_scrape_sends_what_the_tick_rendered(tmp_path):
    """While scrapes come, the tick thread renders /metrics after each tick and a scrape only sends
    it (rendering 20 jobs' ~1,500 series took a scrape ~10 ms); a job added or removed
    between ticks (a reload) shows in the next scrape all the same."""
    events = tmp_path / "a.jsonl"
    events.write_text('{"v":1,"ts":1,"job":"a","kind":"start","rows_total":10}\n')
    monitor = Monitor([JobConfig(name="a", events=str(events))], use_watchdog=False)
    metrics = MetricsEndpoint(monitor)
    monitor.tick(force_scan=True)
    assert metrics.prerenders_total == 0  # nobody scraped yet: the tick renders nothing
    assert 'hsmon_rows_done{job="a"} 0.0' in metrics.render().decode()
    assert metrics.renders_total == 1
    with open(events, "a") as fh:
        fh.write('{"v":1,"ts":2,"job":"a","kind":"rows","rows_done":4}\n')
    monitor.tick()
    assert metrics.prerenders_total == 1
    assert 'hsmon_rows_done{job="a"} 4.0' in metrics.render().decode()
    assert metrics.renders_total == 1  # the scrape sent the tick's text
    monitor.add_job(JobConfig(name="b", events=str(tmp_path / "b.jsonl")))
    assert 'hsmon_job_info{job="b"' in metrics.render().decode()
    monitor.remove_job("b")
    assert 'job="b"' not in metrics.render().decode()
    assert metrics.renders_total == 3

"""The production wiring against real parts: a real Prometheus 2.42, configured from the committed
example (dashboards/prometheus/prometheus.yml: honor_labels, the committed alert rules), scrapes a
real `hsmon daemon` (configured by a hsmon.toml) that watches a real `hsmon extract` of the embedded
target and the original job's packing script (tests/story_job.py: dump files in a directory).

- every query of the committed Grafana dashboard runs in that Prometheus: each parses, and every
  panel that concerns an extraction returns data; every template variable query returns our jobs;
- the extractor frozen with SIGSTOP: HsmonExtractionStalled fires in /api/v1/alerts, and resolves
  after SIGCONT. The wait is the job's stall_after in the hsmon.toml and the Prometheus intervals
  (1 s), both configuration; the rules file is the committed one, unchanged.

One Prometheus, one daemon and one extraction for the whole module."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from daemon_helpers import REPO, STORY, Daemon, Procs, child_env, free_port, wait_until
from extract_helpers import make_dataset
from prometheus_helpers import Prometheus

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("prometheus") is None, reason="prometheus not installed: run `make sysdeps`"
    ),
]

DASHBOARD = REPO / "dashboards" / "grafana" / "dashboards" / "hsmon.json"
STALL_AFTER = 3


class Stack:
    def __init__(self, procs: Procs, tmp: Path) -> None:
        self.procs, self.tmp = procs, tmp
        data = make_dataset(tmp / "data.jsonl", 3000, min_lines=4, max_lines=10)
        self.out, self.events = tmp / "out", tmp / "events.jsonl"
        # the embedded target (no --model), one thread, stdout unbuffered as the unit runs it
        self.extract = procs.start(
            [sys.executable, "-m", "hsmon", "extract", str(data), "--out", str(self.out),
             "--events", str(self.events), "--job", "extract", "--threads", "1", "--chunk-size", "100",
             "--heartbeat", "0.5", "--min-free", "1M"],
            stdout=subprocess.DEVNULL, stderr=open(tmp / "extract.err", "wb"),  # noqa: SIM115
            env=child_env(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1"),
        )
        self.story = procs.start(
            [sys.executable, STORY, str(tmp / "dump"), str(tmp / "story-out"), "--delay", "0.1",
             "--rows", "100000", "--events", str(tmp / "story-events.jsonl")],
            stdout=open(tmp / "story.log", "wb"),  # noqa: SIM115  (buffered: the original job's trap)
        )
        config = tmp / "hsmon.toml"
        config.write_text(f"""
[daemon]
scan_interval = 0.5

[[job]]
name = "extract"
kind = "extract"
out_dir = "{self.out}"
events = "{self.events}"
stall_after = {STALL_AFTER}

[[job]]
name = "story"
kind = "external"
dump_dir = "{tmp / 'dump'}"
out_dir = "{tmp / 'story-out'}"
events = "{tmp / 'story-events.jsonl'}"
pid = {self.story.pid}
stall_after = 30
""")
        self.daemon = Daemon(procs, tmp, ["--config", str(config)])
        self.target = self.daemon.url.removeprefix("http://")
        # the committed example, with this test's intervals, target and rules path (configuration)
        self.prom = Prometheus(procs, tmp, [self.target])

    def api(self, path: str, **params: str) -> Any:
        return self.prom.api(path, **params)

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.prom.query(expr)

    def alerts(self, name: str) -> list[dict[str, Any]]:
        return self.prom.alerts(name)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    procs = Procs()
    try:
        s = Stack(procs, tmp_path_factory.mktemp("prod"))

        def ready() -> bool:
            try:
                return bool(s.query('hsmon_rows_per_second{job="extract"} > 0'))
            except OSError:
                return False

        wait_until(ready, 180, interval=1, what="rows/s of the real extraction in Prometheus")
        yield s
    finally:
        procs.close()


def _substitute(expr: str) -> str:
    """What Grafana does to a query before it reaches Prometheus, for 'All' selected."""
    for var, value in (("$__rate_interval", "10s"), ("$__range", "5m"), ("$job", ".*"),
                       ("$instance", ".*"), ("$sglang_instance", ".*")):
        expr = expr.replace(var, value)
    return expr


def _targets(dashboard: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(p, t) for p in dashboard["panels"] if p["type"] != "row" for t in p["targets"]]


def test_every_dashboard_query_runs_against_the_real_stack(stack: Stack) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    extraction_titles = _extraction_panels()
    empty: list[str] = []

    def all_answer() -> bool:
        answered: dict[str, bool] = {}
        for panel, target in _targets(dashboard):
            result = stack.query(_substitute(target["expr"]))  # a parse error raises HTTP 400
            answered[panel["title"]] = answered.get(panel["title"], False) or bool(result)
        empty[:] = [title for title, ok in answered.items() if not ok and title in extraction_titles]
        return not empty

    # A panel shows data when one of its queries does: /dev/shm's time to full, for one, is absent
    # (unknown) while nothing fills it. Rates need two samples in their window.
    started = time.monotonic()
    try:
        wait_until(all_answer, 60, interval=1, what="data for every extraction panel")
    except AssertionError:
        pytest.fail("extraction panels without data: " + "; ".join(empty))
    print(f"every extraction panel had data {time.monotonic() - started:.1f} s after the first rows/s")
    assert len(_targets(dashboard)) > 40

    # every template variable's query answers with the jobs and the daemon being watched
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    for name, want in (("job", {"extract", "story"}), ("instance", {stack.target})):
        m = re.fullmatch(r"label_values\((.*), (\w+)\)", variables[name]["query"])
        assert m, variables[name]["query"]
        got = stack.api(f"label/{m.group(2)}/values", **{"match[]": _substitute(m.group(1))})["data"]
        assert want <= set(got), (name, got)


def test_stall_alert_fires_on_sigstop_and_resolves_on_sigcont(stack: Stack) -> None:
    assert stack.extract.poll() is None, "the extraction ended before the stall test"
    assert not stack.alerts("HsmonExtractionStalled"), "stall alert firing for a working extraction"
    assert not stack.alerts("HsmonJobDead")
    os.kill(stack.extract.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        alert = wait_until(
            lambda: [a for a in stack.alerts("HsmonExtractionStalled") if a["state"] == "firing"], 60,
            interval=0.5, what="HsmonExtractionStalled firing in /api/v1/alerts",
        )[0]
        fired_after = time.monotonic() - stopped
    finally:
        os.kill(stack.extract.pid, signal.SIGCONT)
    assert alert["labels"]["job"] == "extract" and alert["labels"]["severity"] == "critical"
    assert alert["labels"]["instance"] == stack.target
    assert alert["annotations"]["runbook_url"].endswith("operations.md#hsmonextractionstalled")
    # the why, as the dashboard shows it: the daemon's hints for the job, by id
    hints = {r["metric"]["hint"] for r in stack.query('hsmon_job_hint{job="extract"} == 1')}
    assert {"stalled", "process-stopped"} <= hints, hints
    # the original job, still working, never alerts
    assert all(a["labels"]["job"] == "extract" for a in stack.alerts("HsmonExtractionStalled"))
    print(f"stall alert fired {fired_after:.1f} s after SIGSTOP (stall_after {STALL_AFTER} s)")
    resumed = time.monotonic()
    wait_until(lambda: not stack.alerts("HsmonExtractionStalled"), 90, interval=0.5,
               what="the stall alert to resolve after SIGCONT")
    print(f"resolved {time.monotonic() - resumed:.1f} s after SIGCONT")
    assert stack.extract.poll() is None


def _extraction_panels() -> set[str]:
    sys.path.insert(0, str(REPO / "dashboards"))
    try:
        import hsmon_dashboard
    finally:
        sys.path.pop(0)
    return {p.title for _, panels in hsmon_dashboard.rows() for p in panels if p.extraction}


def test_status_of_several_daemons_in_one_table(stack: Stack, tmp_path: Path) -> None:
    """One daemon per host: `hsmon status --url A --url B` lists every job of both, and a daemon that
    does not answer as a row of its own (exit 1)."""
    other = Daemon(stack.procs, tmp_path, ["--job", "other-host-job", "--out", str(tmp_path)])
    gone = f"http://127.0.0.1:{free_port()}"
    cmd = [sys.executable, "-m", "hsmon", "status",
           "--url", stack.daemon.url, "--url", other.url, "--url", gone]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=child_env())
    assert res.returncode == 1, res.stderr  # the unreachable daemon
    lines = res.stdout.splitlines()
    assert lines[0].split()[:4] == ["DAEMON", "JOB", "KIND", "STATE"]
    rows = {(line.split()[0], line.split()[1]): line.split()[3] for line in lines[1:]}
    a, b, c = stack.target, other.url.removeprefix("http://"), gone.removeprefix("http://")
    assert rows[(a, "extract")] in ("RUNNING", "SILENT", "STARTING") and (a, "story") in rows
    assert (b, "other-host-job") in rows and rows[(c, "-")] == "UNREACHABLE"
    res = subprocess.run([*cmd[:-2], "--json"], capture_output=True, text=True, timeout=60, env=child_env())
    docs = json.loads(res.stdout)
    assert res.returncode == 0 and [d["url"] for d in docs] == [stack.daemon.url, other.url]
    assert {j["job"] for j in docs[0]["status"]["jobs"]} == {"extract", "story"}
    other.stop()

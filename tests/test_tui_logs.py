"""The Logs view on a real job: a real `hsmon extract` whose output goes to a file names that file in
its start event; the status document lists it (``jobs[].logs``); `l` on the dashboard (its trackers
in-process, as `hsmon tui --out --events` runs them) tails it, follows what is appended, searches
it, and reads a rotated log from its start."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from extract_helpers import extract_cmd, extract_env, make_dataset, tiny_model  # noqa: F401 (fixture)
from test_tui_pilot import wait_for
from test_tui_rough_edges import in_process
from textual.widgets import Log

from hsmon.tui.app import HsmonApp
from hsmon.tui.screens.logs import LogScreen, Tail

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def extraction(tmp_path_factory, tiny_model):  # noqa: F811
    """(output, events, log): a finished real extraction, its output to a log file."""
    base = tmp_path_factory.mktemp("logs")
    data = make_dataset(base / "data.jsonl", rows=20, seed=3, min_lines=1, max_lines=2)
    out, events, log = base / "extract", base / "events.jsonl", base / "extract.log"
    with open(log, "w") as fh:
        proc = subprocess.run(extract_cmd(data, out, tiny_model, "--chunk-size", "8", events=events),
                              stdout=fh, stderr=subprocess.STDOUT, env=extract_env(), timeout=300)
    assert proc.returncode == 0, log.read_text()[-2000:]
    return out, events, log


def test_the_status_document_names_the_log(extraction) -> None:
    out, events, log = extraction
    start = json.loads(events.read_text().splitlines()[0])
    assert start["kind"] == "start" and start["log"] == str(log)
    proc = subprocess.run([sys.executable, "-m", "hsmon", "status", "--out", str(out),
                           "--events", str(events), "--json"], capture_output=True, text=True, timeout=60)
    (job,) = json.loads(proc.stdout)["jobs"]
    assert job["logs"][0] == {"path": str(log), "what": "the job's log (its start event)"}, job["logs"]


@pytest.mark.asyncio
async def test_l_tails_the_jobs_log_follows_it_and_searches_it(extraction) -> None:
    out, events, log = extraction
    app = HsmonApp(in_process(out, events))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.documents and app.selected is not None, 20)
        await pilot.press("l")
        await wait_for(pilot, lambda: isinstance(app.screen, LogScreen))
        lines = app.screen.query_one(Log)
        await wait_for(pilot, lambda: any("hsmon extract: done" in line for line in lines.lines), 5)
        title = str(app.screen.query_one("#log-title").render())
        assert str(log) in title and "following" in title
        with open(log, "a") as fh:  # appended while the screen is open: shown within a second or two
            fh.write("a line appended after the run\n")
        await wait_for(pilot, lambda: "a line appended after the run" in lines.lines, 5)
        await pilot.press("slash", *"appended")
        await wait_for(pilot, lambda: list(lines.lines) == ["a line appended after the run"], 5)
        assert app.screen.search == "appended"
        await pilot.press("escape")  # clears the search: every line again
        await wait_for(pilot, lambda: len(lines.lines) > 2, 5)
        await pilot.press("escape")  # back to the overview
        await wait_for(pilot, lambda: not isinstance(app.screen, LogScreen))


def test_a_rotated_or_truncated_log_is_read_again_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text("one\ntwo\nthree (no newline yet)")
    tail = Tail(str(log))
    assert tail.read() == (["one", "two"], False)  # a partial last line waits for its end
    with open(log, "a") as fh:
        fh.write(" done\n")
    assert tail.read() == (["three (no newline yet) done"], False)
    log.rename(tmp_path / "run.log.1")  # rotated, as hsmon run rotates its log
    log.write_text("fresh\n")
    assert tail.read() == (["fresh"], True)
    log.write_text("")  # truncated
    assert tail.read() == ([], True)
    assert Tail(str(tmp_path / "absent.log")).read() == ([], False)

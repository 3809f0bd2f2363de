"""The rough edges as a new user meets them on a finished extraction: a process that is gone
shows PID '-', no stray scrollbar glyph at the right edge at 80x24, a finished job read from its
files shows its rate history (rebuilt from its events file), and an output directory named
`extract` gives a job named `extract`, not `extract-extract`.

The last two on a real `hsmon extract` run (tiny model) read by the TUI with its trackers
in-process, as `hsmon tui --out DIR --events FILE` does.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import tui_run_documents as run_documents
from extract_helpers import make_dataset, run_extract, tiny_model  # noqa: F401
from test_tui_pilot import running, screen_text, wait_for
from textual.widgets import Sparkline
from tui_complete import fixed_source

from hsmon.tui import cli
from hsmon.tui.app import HsmonApp
from hsmon.tui.sources import InProcessSource
from hsmon.tui.widgets.job_header import JobHeader
from hsmon.tui.widgets.processes import ProcessTable

pytestmark = pytest.mark.asyncio
HALF_BLOCKS = "▁▂▃▄▅▆▇"


def gone_process_documents() -> list[dict]:
    docs = run_documents.finished_extraction()
    for doc in docs:
        for job in doc["jobs"]:
            for proc in job.get("processes") or []:
                proc.update(pid=None, alive=False, status="gone")
    return docs


async def test_a_gone_process_without_pid_shows_a_dash() -> None:
    sources = [fixed_source(gone_process_documents(), label="fixture")]
    async with running(sources, size=(160, 48)) as (app, pilot):
        table = app.screen.query_one(ProcessTable)
        await wait_for(pilot, lambda: table.rows and "gone" in table.rows[0])
        assert table.rows[0][1] == "-"
        assert "None" not in screen_text(app)


def right_edge(app: HsmonApp, columns: int = 3) -> str:
    """The last columns of every line but the footer, as shown."""
    return "".join(line[-columns:] for line in screen_text(app).splitlines()[:-1])


@pytest.mark.parametrize("keys", [(), ("t",)], ids=["overview", "training"])
async def test_no_stray_scrollbar_glyph_at_the_right_edge_at_80x24(keys: tuple[str, ...]) -> None:
    docs = run_documents.finished_training() if keys else run_documents.finished_extraction()
    async with running([fixed_source(docs, label="fixture")], size=(80, 24)) as (app, pilot):
        for key in keys:
            await pilot.press(key)
        await pilot.pause(0.5)
        page = app.screen.query_one("#training-body" if keys else "JobOverview")
        assert page.max_scroll_y > 0  # the page scrolls: its scrollbar is drawn
        edge = right_edge(app)
        assert not set(edge) & set(HALF_BLOCKS), edge
        page.scroll_to(y=page.max_scroll_y // 2, animate=False)
        await pilot.pause(0.2)
        assert not set(right_edge(app)) & set(HALF_BLOCKS)


# -- a real finished extraction, read from its files -------------------------------------------------
ROWS = 48


@pytest.fixture(scope="module")
def extraction(tmp_path_factory, tiny_model) -> tuple[Path, Path]:  # noqa: F811
    """`hsmon extract` run to the end into a directory named `extract`, with its events file."""
    base = tmp_path_factory.mktemp("rough")
    data = make_dataset(base / "data.jsonl", rows=ROWS, seed=23, min_lines=1, max_lines=3)
    out, events = base / "extract", base / "events.jsonl"
    proc = run_extract(data, out, tiny_model, "--chunk-size", "16", events=events)
    assert proc.returncode == 0, proc.stderr
    return out, events


def in_process(out: Path, events: Path) -> list[InProcessSource]:
    """The sources of `hsmon tui --out OUT --events EVENTS`."""
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return cli.build_sources(parser.parse_args(["--out", str(out), "--events", str(events)]))


@pytest.mark.slow
async def test_a_finished_job_from_its_files_keeps_its_name_and_its_rate_history(extraction) -> None:
    out, events = extraction
    app = HsmonApp(in_process(out, events))
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.documents and "DONE" in screen_text(app), timeout=20)
        (key,) = [key for key, _job, _doc in app.jobs()]
        assert key[1] == "extract"
        header = app.screen.query_one(JobHeader)
        assert " extract (" in str(header.render()) and "extract-extract" not in screen_text(app)
        rows = app.screen.query_one("#spark-rows", Sparkline)
        await wait_for(pilot, lambda: len(set(rows.data or [])) > 1)  # not flat: the run's history
        history = app.history(key)
        assert len(history.rows_per_s) > 1 and max(history.rows_per_s) > 0
        assert max(history.tokens_per_s) > 0



async def test_a_finished_extraction_shows_no_disk_projection() -> None:
    """A document whose writer left "time to full" and "time to done" on an ended job (its last
    minute's write rate): the disk panel shows the headroom, not "full in 4h09m, done in 0s"."""
    docs = run_documents.finished_extraction()
    for disk in docs[-1]["jobs"][0]["disk"]:
        disk.update(time_to_full_s=14_940.0, time_to_done_s=0.0)
    async with running([fixed_source(docs[-1:], label="fixture")], size=(160, 48)) as (app, pilot):
        await wait_for(pilot, lambda: "DONE" in screen_text(app) and "free, needs" in screen_text(app))
        assert "full in" not in screen_text(app) and "done in" not in screen_text(app)

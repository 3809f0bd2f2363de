"""A daemon that exits with its run (as `hsmon online --daemon`'s does) leaves the dashboard its last
document and result, not "disconnected, retrying" over stale figures; a daemon that goes away while a
job still runs is still an alarm. A real job writer, a real `hsmon daemon`, the TUI in a pilot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from daemon_helpers import Daemon, child_env, procs  # noqa: F401
from test_tui_pilot import running, screen_text, wait_for

from hsmon.tui.sources import HttpStatusSource
from hsmon.tui.widgets.connection_bar import ConnectionBar
from hsmon.tui.widgets.job_header import JobHeader

WRITER = str(Path(__file__).with_name("tui_job_writer.py"))


def finished_job(tmp_path: Path) -> list[str]:
    """A job run to its done record; the daemon's arguments that watch it."""
    out, events = tmp_path / "out", tmp_path / "events.jsonl"
    subprocess.run(
        [sys.executable, WRITER, "--out", str(out), "--events", str(events), "--rows", "30",
         "--rate", "1000", "--chunk-size", "10"],
        env=child_env(), check=True, timeout=60,
    )  # fmt: skip
    return ["--job", "extract", "--kind", "extract", "--out", str(out), "--events", str(events)]


@pytest.mark.asyncio
async def test_a_daemon_gone_after_its_job_ended_leaves_the_result(procs, tmp_path: Path) -> None:  # noqa: F811
    daemon = Daemon(procs, tmp_path, [*finished_job(tmp_path), "--scan-interval", "0.5"])
    source = HttpStatusSource(daemon.url, interval=0.2, timeout=1.0)
    async with running([source], size=(120, 40)) as (app, pilot):
        header = app.screen.query_one(JobHeader)
        await wait_for(pilot, lambda: " DONE " in str(header.render()), timeout=20)
        daemon.stop()
        bar = app.screen.query_one(ConnectionBar)
        await wait_for(pilot, lambda: "gone after every job it watched had ended" in str(bar.render()))
        text = screen_text(app)
        assert " DONE " in str(header.render()) and "30 / 30" in text.replace(",", ""), text
        assert "disconnected, retrying" not in text and "figures are" not in str(header.render()), text
        assert not bar.has_class("-down")


@pytest.mark.asyncio
async def test_a_daemon_gone_while_its_job_runs_is_still_an_alarm(procs, tmp_path: Path) -> None:  # noqa: F811
    out, events = tmp_path / "out", tmp_path / "events.jsonl"
    writer = procs.start([sys.executable, WRITER, "--out", str(out), "--events", str(events), "--rows",
                          "100000", "--rate", "20"])  # fmt: skip
    daemon = Daemon(procs, tmp_path, ["--job", "extract", "--kind", "extract", "--out", str(out),
                                      "--events", str(events), "--pid", str(writer.pid)])  # fmt: skip
    source = HttpStatusSource(daemon.url, interval=0.2, timeout=1.0)
    async with running([source], size=(120, 40)) as (app, pilot):
        header = app.screen.query_one(JobHeader)
        await wait_for(pilot, lambda: " RUNNING " in str(header.render()), timeout=20)
        daemon.stop()
        bar = app.screen.query_one(ConnectionBar)
        await wait_for(pilot, lambda: "disconnected, retrying" in str(bar.render()))
        assert bar.has_class("-down") and "figures are" in str(header.render())

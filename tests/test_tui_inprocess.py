"""`hsmon tui` with the trackers in-process (no daemon): a real job process watched for real,
and a real `hsmon train` launched detached from the training screen."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_tui_e2e import repo_env
from test_tui_pilot import screen_text, wait_for
from textual.widgets import TabbedContent

from hsmon.core.config import JobConfig
from hsmon.tui.app import HsmonApp
from hsmon.tui.screens.confirm import ConfirmScreen
from hsmon.tui.screens.training import TrainingScreen
from hsmon.tui.sources import InProcessSource

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]
WRITER = str(Path(__file__).with_name("tui_job_writer.py"))


def start_writer(tmp_path: Path, rate: float = 20.0, rows: int = 100_000) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            WRITER,
            "--out",
            str(tmp_path / "out"),
            "--events",
            str(tmp_path / "events.jsonl"),
            "--rows",
            str(rows),
            "--rate",
            str(rate),
            "--chunk-size",
            "20",
            "--reject-every",
            "7",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=repo_env(),
    )


def job_config(tmp_path: Path, pid: int) -> JobConfig:
    return JobConfig(
        name="extract",
        kind="extract",
        out_dir=str(tmp_path / "out"),
        events=str(tmp_path / "events.jsonl"),
        pid=pid,
        stall_after=30,
    )


async def test_watches_a_real_job_until_it_dies(tmp_path: Path) -> None:
    writer = start_writer(tmp_path)
    try:
        app = HsmonApp([InProcessSource([job_config(tmp_path, writer.pid)], interval=0.3)])
        async with app.run_test(size=(160, 60)) as pilot:
            await wait_for(pilot, lambda: "RUNNING" in screen_text(app), timeout=20)
            text = screen_text(app)
            assert "● local" in text and "extract (extract)" in text
            assert "/ 100.0k" in text  # rows done against the total from the start event
            assert "extractor" in text and str(writer.pid) in text  # processes table
            writer.send_signal(signal.SIGKILL)
            writer.wait()
            await wait_for(pilot, lambda: "DEAD" in screen_text(app), timeout=20)
    finally:
        writer.kill()
        writer.wait()


async def test_launch_and_stop_a_real_training_detached(tmp_path: Path) -> None:
    writer = start_writer(tmp_path, rate=200, rows=100)
    writer.wait(timeout=30)  # a finished extraction: its manifest lists complete chunks
    app = HsmonApp([InProcessSource([job_config(tmp_path, writer.pid)], interval=0.3)])
    out_dir = tmp_path / "out-drafter"
    pid = None
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.documents)
            await pilot.press("t")
            await wait_for(pilot, lambda: isinstance(app.screen, TrainingScreen))
            await pilot.press("l")
            await wait_for(pilot, lambda: (out_dir / "train.pid").exists(), timeout=20)
            pid = int((out_dir / "train.pid").read_text())
            await wait_for(pilot, lambda: app.launched is not None, timeout=10)
            name = app.launched[1]
            assert name == "train-out-drafter"
            await wait_for(pilot, lambda: app.job(app.launched) is not None, timeout=10)
            assert (out_dir / "train.log").exists()
            assert os.getsid(pid) != os.getsid(0) if _alive(pid) else True  # its own session: detached
            await pilot.press("s")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
            await pilot.press("y")
            await wait_for(pilot, lambda: any(n.title in ("stop", "stop failed") for n in app._notifications))
            await pilot.press("o")
            tabs = app.screen.query_one(TabbedContent)
            await wait_for(pilot, lambda: len(tabs.query("Tab")) == 2)
    finally:
        if pid is not None and _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_form_takes_the_target_from_the_manifest_when_the_start_event_is_gone(tmp_path: Path) -> None:
    out, model = tmp_path / "out", tmp_path / "my-target"
    out.mkdir()
    model.mkdir()
    record = {"type": "run", "settings": {"model": str(model), "chunk_size": 100}}
    (out / "hsmon-manifest.jsonl").write_text(json.dumps(record) + "\n")
    cfg = JobConfig(name="extract", kind="extract", out_dir=str(out), stall_after=30)
    app = HsmonApp([InProcessSource([cfg], interval=0.3)])
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.documents)
        await pilot.press("t")
        await wait_for(pilot, lambda: isinstance(app.screen, TrainingScreen))
        form = app.screen.query_one("#field-target_model")
        await wait_for(pilot, lambda: form.value == str(model))
        assert app.screen.query_one("#field-data_dir").value == str(out)

"""No silent restart, with the real trainer: `hsmon train` over a checkpoint
without --resume is refused in one line naming the step and both ways on (before: it started at
step 0 and LATEST then named the new run's files beside the orphaned step); the launch API takes
`resume`; the dashboard has Resume beside Launch, draws a run started again as a new run (before:
40 s of the old run's step as RUNNING, then both runs joined in one chart), and tells its user to
press Resume, never to type a command they did not type."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from extract_helpers import events_of, tiny_model  # noqa: F401
from regen_helpers import env
from textual.pilot import Pilot
from textual.widgets import Input, Static
from train_helpers import markov_sequences, write_rows

from hsmon.core.config import JobConfig
from hsmon.launch.training import validate_training_request
from hsmon.tui.app import HsmonApp
from hsmon.tui.screens.confirm import ConfirmScreen
from hsmon.tui.screens.training import TrainingScreen
from hsmon.tui.sources import InProcessSource

pytestmark = pytest.mark.slow
SAID: list[str] = []  # the dashboard's notifications (they fade from the screen)


@pytest.fixture(scope="module")
def extracted(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:  # noqa: F811
    """Rows of the tiny target in hsmon extract's layout (written in-process: the trainer is the
    process under test)."""
    data = tmp_path_factory.mktemp("rows") / "data"
    write_rows(tiny_model, data, markov_sequences(32, 40, seed=3))
    return data


@pytest.fixture(scope="module")
def checkpointed(extracted: Path, tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:  # noqa: F811
    """A training's --out after 2 steps (its checkpoint at step 2); each test works on a copy."""
    out = tmp_path_factory.mktemp("first") / "drafter"
    first = train(extracted, out, tiny_model, "--max-steps", "2")
    assert first.returncode == 0, first.stderr[-2000:]
    return out


def copy_of(checkpointed: Path, tmp_path: Path) -> Path:
    out = tmp_path / "drafter"
    shutil.copytree(checkpointed, out, ignore=shutil.ignore_patterns("*.lock", "train.pid"))
    return out


def train(extracted: Path, out: Path, model: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "hsmon", "train", str(extracted), "--out", str(out), "--target-model",
            str(model), "--threads", "1", "--events", str(out.parent / f"{out.name}.jsonl"), *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env())


def test_a_training_over_a_checkpoint_is_refused_unless_resume_or_restart(
        extracted: Path, checkpointed: Path, tmp_path: Path, tiny_model: Path) -> None:  # noqa: F811
    out = copy_of(checkpointed, tmp_path)
    latest = (out / "checkpoints" / "LATEST").read_text()
    again = train(extracted, out, tiny_model, "--max-steps", "4")
    assert again.returncode == 2, again.stderr
    assert again.stderr.strip() == (
        f"hsmon train: --out {out} holds a checkpoint at step 2 (step-00000002.pt): add --resume to go on "
        "from step 2, or --restart to start over at step 0 (its checkpoints are removed)")
    assert (out / "checkpoints" / "LATEST").read_text() == latest  # nothing touched
    both = train(extracted, out, tiny_model, "--resume", "--restart")
    assert both.returncode == 2 and len(both.stderr.strip().splitlines()) == 1, both.stderr
    resumed = train(extracted, out, tiny_model, "--max-steps", "3", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    start = [e for e in events_of(tmp_path / "drafter.jsonl") if e["kind"] == "start"][-1]
    assert start["start_step"] == 2 and start["resumed_from"].endswith("step-00000002.pt"), start
    restarted = train(extracted, out, tiny_model, "--max-steps", "1", "--restart")
    assert restarted.returncode == 0, restarted.stderr[-2000:]
    said = f"--restart: removed 2 checkpoint(s) of {out} (up to step 3); starting at step 0"
    assert said in restarted.stderr, restarted.stderr
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*.pt")) == ["step-00000001.pt"]


def test_the_launch_api_refuses_a_launch_over_a_checkpoint_and_takes_resume(tmp_path: Path) -> None:
    out = tmp_path / "drafter"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "step-00000013.pt").write_bytes(b"")
    data = tmp_path / "data"
    data.mkdir()
    (data / "hsmon-manifest.jsonl").write_text('{"type": "run"}\n')  # an extraction's output
    fields = {"data_dir": str(data), "out_dir": str(out)}
    _, errors = validate_training_request(fields)
    assert errors["out_dir"] == (f"{out} holds a checkpoint at step 13: resume (yes) goes on from it, "
                                 "restart (yes) starts over at step 0 and removes it")
    request, errors = validate_training_request({**fields, "resume": "yes"})
    assert request is not None and not errors and request.resume
    _, errors = validate_training_request({**fields, "resume": "yes", "restart": "yes"})
    assert "give one of them" in errors["restart"]


async def wait_for(pilot: Pilot, condition: Callable[[], Any], what: str, timeout: float = 240) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (found := condition()):
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}; the dashboard said {SAID}")
        await pilot.pause(0.1)
    return found


def first_step(history: Any) -> float | None:
    """The first step the dashboard's plots of a training hold (None before its first step)."""
    loss = history.unroll.loss
    return loss[0].span[0] if loss and loss[0].span else None


@pytest.mark.asyncio
async def test_the_dashboard_resumes_and_draws_a_run_started_again_as_a_new_run(
        extracted: Path, checkpointed: Path, tmp_path: Path, tiny_model: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    out = copy_of(checkpointed, tmp_path)
    for name, value in env(HSMON_TRAIN_STEP_DELAY_S="0.5").items():
        monkeypatch.setenv(name, value)  # the launched trainings' environment: slow steps
    monkeypatch.delenv("HSMON_TRAIN_COMMAND", raising=False)
    extraction = JobConfig(name="extract", kind="extract", out_dir=str(extracted))
    source = InProcessSource([extraction], interval=0.3)
    app = HsmonApp([source])
    notify = app.notify
    app.notify = lambda message, *a, **k: (SAID.append(str(message)), notify(message, *a, **k))[1]  # type: ignore[method-assign]
    pids: list[int] = []
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.documents, "the first document")
            await pilot.press("t")
            await wait_for(pilot, lambda: isinstance(app.screen, TrainingScreen), "the training screen")
            form = app.screen
            form.query_one("#field-out_dir", Input).value = str(out)
            form.query_one("#field-target_model", Input).value = str(tiny_model)
            form.query_one("#field-epochs", Input).value = "100"  # steps enough to stop it mid-run
            await pilot.pause(0.2)
            error = form.query_one("#error-out_dir", Static)
            said = str(error.render())
            assert error.display and said == (f"{out} holds a checkpoint at step 2: Resume goes on from it; "
                                              "for a new training choose another output directory"), said
            await pilot.press("l")  # refused: nothing launched
            await pilot.pause(0.5)
            assert source.monitor.job_names() == ["extract"]
            await pilot.press("R")
            key = await wait_for(pilot, lambda: app.launched, "the resumed training launched")
            pids.append(source.monitor.job_pid(key[1]) or 0)
            seen: list[tuple[str, Any]] = []

            def stepped() -> bool:
                job = app.job(key)
                if job is not None:
                    seen.append((job.state, job.training.step if job.training else None))
                return bool(job and job.training and job.training.step and job.training.step >= 3)

            await wait_for(pilot, stepped, "the resumed run's first step")
            # from the launch on, never the old run's step (2) and never its `stopped` as this job's
            assert all(step is None or step >= 3 for _, step in seen), seen
            await pilot.press("s")
            await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the stop question")
            await pilot.press("y")
            job = await wait_for(pilot, lambda: (j := app.job(key)) and j.state == "stopped" and j, "stopped")
            reason = job.reason
            assert "Resume (the dashboard's training form" in reason and "hsmon train" not in reason, reason
            stopped_at = job.training.step
            assert first_step(app.history(key)) >= 3  # this run's steps only
            await wait_for(pilot, lambda: not any(p.alive for p in app.job(key).processes), "its end")
            await pilot.press("R")  # started again in the same tab: a new run
            await wait_for(pilot, lambda: (j := app.job(key)) and j.state not in ("stopped", "done"), "again")
            pids.append(source.monitor.job_pid(key[1]) or 0)
            history = app.history(key)
            assert first_step(history) is None or first_step(history) > stopped_at, first_step(history)
            await wait_for(pilot, lambda: first_step(app.history(key)) is not None, "the new run's step")
            assert first_step(app.history(key)) > stopped_at
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)

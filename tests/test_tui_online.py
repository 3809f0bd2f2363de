"""The TUI's online panel: both sides of an online job on its overview, hidden for any
other job; a snapshot of a job whose trainer is the bottleneck and one whose trainer died."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import tui_run_documents as run
from textual.pilot import Pilot
from tui_complete import fixed_source
from tui_screen_text import screen_lines

from hsmon.tui.app import HsmonApp
from hsmon.tui.widgets.online_panel import OnlinePanel

SPOOL = "/dev/shm/spool"


def online(dead: bool) -> dict[str, Any]:
    """The ``online`` section of a job where training is the slower side (or its trainer died)."""
    gone = "trainer PID 5151 is gone without a done record"
    trainer = ({"role": "trainer", "state": "dead", "reason": gone,
                "rows_per_s": 0.0, "pid": 5151, "wait_frac": 0.0} if dead else
               {"role": "trainer", "state": "running", "reason": "a step 2s ago", "rows_per_s": 18.25,
                "pid": 5151, "wait_frac": 0.0})
    return {"path": SPOOL, "limit_bytes": 20_000_000, "spool_bytes": 19_400_000, "rows_written": 180,
            "rows_consumed": 96, "rows_waiting": 84, "passes": 2, "consume": True, "trainer_step": 41,
            "window_s": 600.0, **({} if dead else {"trainer_arch": "eagle3.1"}),
            "producer": {"role": "extractor", "state": "paused",
                         "reason": "spool full: 19.4 MB of rows waiting for the trainer (limit 20.0 MB)",
                         "rows_per_s": 20.5, "pid": None, "wait_frac": 0.41},
            "consumer": trainer,
            "bottleneck": "training is the bottleneck: extraction waited for spool room 41 % of the "
                          "last 10 min"}


def documents(dead: bool) -> list[dict[str, Any]]:
    docs = copy.deepcopy(run.running_extraction())
    for doc in docs:
        job = doc["jobs"][0]
        job["online"] = online(dead)
        if dead:
            job["state"], job["reason"] = "dead", "trainer PID 5151 is gone without a done record"
            job["hints"] = [{"id": "trainer-dead", "severity": "critical",
                             "message": "trainer PID 5151 is gone without a done record: rerun it "
                                        "with --resume"}]
    return docs


def run_app(dead: bool, docs: list[dict[str, Any]] | None = None) -> HsmonApp:
    return HsmonApp([fixed_source(docs if docs is not None else documents(dead), label="127.0.0.1:9108")])


async def shown(pilot: Pilot) -> None:
    app = pilot.app
    for _ in range(200):
        if app.query(OnlinePanel) and 0 in app.documents and app.query_one(OnlinePanel).display:
            break
        await pilot.pause(0.05)
    await pilot.pause(0.3)


@pytest.mark.asyncio
async def test_both_sides_together_and_the_alarm_only_when_a_side_is_dead() -> None:
    for dead in (False, True):
        app = run_app(dead)
        async with app.run_test(size=(160, 48)) as pilot:
            await shown(pilot)
            panel = app.query_one(OnlinePanel)
            assert panel.display and panel.has_class("-alarm") is dead
            text = "\n".join(screen_lines(app.export_screenshot()))
            assert "19.4 MB of 20.0 MB (97 %), 84 rows waiting" in text
            assert "extractor  PAUSED   20.50 rows/s written, waited 41 %" in text
            assert ("trainer    DEAD" if dead else "trainer    RUNNING  18.25 rows/s consumed") in text
            assert "training is the bottleneck:" in text
            assert ("a step 2s ago  (eagle3.1)" in text) is not dead  # the trainer's start event's arch
            assert "extraction waited for spool room 41 % of the last 10 min" in text


@pytest.mark.asyncio
async def test_hidden_for_a_job_that_is_not_online() -> None:
    app = run_app(False, run.running_extraction())
    async with app.run_test(size=(160, 48)) as pilot:
        for _ in range(100):
            if app.query(OnlinePanel) and 0 in app.documents:
                break
            await pilot.pause(0.05)
        await pilot.pause(0.3)
        assert not app.query_one(OnlinePanel).display


def test_snapshot_of_a_trainer_that_died_while_the_spool_is_full(snap_compare) -> None:
    assert snap_compare(run_app(True), terminal_size=(160, 48), run_before=shown)


@pytest.mark.asyncio
async def test_the_training_form_offers_follow_for_an_online_extraction_only() -> None:
    from hsmon.tui.widgets.training_form import TrainingForm

    for docs, shown_follow in ((documents(False), True), (run.running_extraction(), False)):
        app = run_app(False, docs)
        async with app.run_test(size=(160, 48)) as pilot:
            for _ in range(100):
                if 0 in app.documents:
                    break
                await pilot.pause(0.05)
            await pilot.press("t")
            await pilot.pause(0.3)
            form = app.screen.query_one(TrainingForm)
            boxes = [form.query_one(f"#box-{name}").display for name in ("follow", "passes", "consume")]
            assert boxes == [shown_follow] * 3
            values = form.values
            assert (values["follow"], values["consume"]) == (("yes", "yes") if shown_follow else ("no", "no"))
            text = "\n".join(screen_lines(app.export_screenshot()))
            # its trainer already follows it: the form says so rather than invite a second one
            assert ("a training already follows extraction extract" in text) is shown_follow


def streaming() -> list[dict[str, Any]]:
    """A streaming online job as the daemon shows it: the extractor paused on a full spool, the
    trainer (the bottleneck) running with 40 minutes of steps left, so the job's ETA is the
    trainer's; both sides among its processes; more events than the events panel holds."""
    docs = documents(False)
    for doc in docs:
        job = doc["jobs"][0]
        job["online"]["producer"]["eta_s"] = 4.0
        job["online"]["consumer"]["eta_s"] = 2400.0
        job["progress"]["eta_s"] = 2400.0
        extractor = job["processes"][0]
        job["processes"] = [extractor, dict(extractor, role="trainer", pid=5151, cpu_percent=98.5,
                                            rss_bytes=2_100_000_000)]
        ts = job["recent_events"][-1]["ts"]
        job["recent_events"] = job["recent_events"] + [
            {"v": 1, "ts": ts + 0.1 * i, "job": "extract", "kind": "heartbeat", "rows_done": 181,
             "rows_total": 300} for i in range(30)]
    return docs


def panel_rows(lines: list[str], title: str) -> list[str]:
    """The rows of the panel whose top border carries ``title`` (borders excluded)."""
    top = next(i for i, line in enumerate(lines) if f"─ {title}" in line)
    bottom = next(i for i in range(top + 1, len(lines)) if lines[i].lstrip().startswith("╰"))
    return lines[top + 1:bottom]


SCROLL_GLYPHS = set("▁▂▃▄▅▆▇")


@pytest.mark.asyncio
@pytest.mark.parametrize("size", [(80, 24), (120, 40), (160, 48)])
async def test_a_streaming_online_job_at_each_size(size: tuple[int, int]) -> None:
    """The header's ETA is the slower side's and says so; the processes panel lists both sides;
    the online panel's lines are whole where the terminal has room (the whole width from 120
    columns); the events panel draws no half-cell scrollbar glyph at its edge."""
    app = run_app(False, streaming())
    async with app.run_test(size=size) as pilot:
        await shown(pilot)
        lines = screen_lines(app.export_screenshot())
        text = "\n".join(lines)
        assert "RUNNING  extract (extract + train)  elapsed 7s  ETA 40m (training)" in text
        online = "\n".join(panel_rows(lines, "online: the spool and both sides"))
        assert "19.4 MB of 20.0 MB (97 %), 84 rows waiting" in online, online
        assert "spool full: waiting for the trainer to consume rows" in online
        assert "ETA 40m, PID 5151" in online and "ETA 4s" in online
        if size[0] >= 120:
            assert "…" not in online, online
        if size[1] >= 40:  # at 80x24 the page scrolls: the panels below are out of sight
            procs = [r.split()[1] for r in panel_rows(lines, "processes") if r.split()[1:2]]
            assert procs[1:] == ["extractor", "trainer"], procs
            events = panel_rows(lines, "events")
            assert len(events) >= 5 and not SCROLL_GLYPHS & set("".join(r[-3:] for r in events)), events


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (160, 48)])
def test_snapshot_of_a_streaming_online_job(snap_compare, size: tuple[int, int]) -> None:
    assert snap_compare(run_app(False, streaming()), terminal_size=size, run_before=shown)


@pytest.mark.asyncio
async def test_the_training_tab_shows_the_online_trainer_rather_than_inviting_a_second() -> None:
    """The trainer of an online job (the consumer side of its spool) is the training the tab shows:
    its state, step, architecture and rate, and that a training already follows the extraction."""
    docs = streaming()
    for doc in docs:  # the trainer's figures, as the online section carries them
        doc["jobs"][0]["online"]["training"] = {
            "step": 41, "epoch": 0, "loss": [5.4436, 5.5], "acc": [0.26489, 0.2], "tokens_per_s": 2123.4,
            "last_checkpoint": None, "eta_s": None, "lr": 0.0001234567}
    app = run_app(False, docs)
    async with app.run_test(size=(160, 48)) as pilot:
        await shown(pilot)
        await pilot.press("t")
        await pilot.pause(0.3)
        text = "\n".join(screen_lines(app.export_screenshot()))
        assert "no training job yet" not in text
        assert "RUNNING  trainer following extract  PID 5151  ETA 40m" in text, text
        assert "a training already follows this extraction" in text
        assert "step 41, eagle3.1, 18.25 rows/s consumed" in text
        assert "spool: 96 of 180 rows consumed, 84 waiting, 2 passes per row" in text
        assert "loss 5.444 (pos 0), mean 5.472" in text and "acc 26.5% (pos 0), mean 23.2%" in text
        assert "lr 1.235e-4" in text
        assert "a training already follows extraction extract" in text  # the form's warning

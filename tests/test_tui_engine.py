"""The overview's servers/GPUs panel: its pure lines, the widget driven by the pilot, and snapshots
at 80x24 and 160x48 from fixed documents (tests/tui_documents.py plus servers and GPUs)."""

from __future__ import annotations

import asyncio
import copy
import re
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from tui_complete import fixed_source, shown_ts, typed, typed_as
from tui_documents import documents

from hsmon.status_doc import GpuSection
from hsmon.tui.app import HsmonApp
from hsmon.tui.engine_view import gpu_lines, server_lines, spark
from hsmon.tui.view import JobHistory
from hsmon.tui.widgets.engine_panel import EnginePanel

GPUS = {
    "available": True, "reason": None, "last_poll_ts": None,
    "devices": [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "utilization": 0.97,
         "memory_used_bytes": 71_468_302_336, "memory_total_bytes": 85_520_809_984, "power_watts": 612.0,
         "temperature_celsius": 66,
         "processes": [{"pid": 5000, "used_memory_bytes": 71_000_000_000}], "zero_since_ts": None},
        {"index": 1, "name": "NVIDIA H100 80GB HBM3", "utilization": 0.0,
         "memory_used_bytes": 71_468_302_336, "memory_total_bytes": 85_520_809_984, "power_watts": None,
         "temperature_celsius": 41,
         "processes": [], "zero_since_ts": 1.0},
    ],
}


def server(url: str, state: str, step: int) -> dict[str, Any]:
    up = state == "up"
    return {
        "url": url, "state": state,
        "detail": "/health_generate answered in 1.0 s" if up else
                  "the HTTP front answers but /health_generate failed (HTTP 503)",
        "model": "extractor/embedded", "info": {"version": "0.5.23"}, "reachable": True,
        "liveness_endpoint": "/metrics", "metrics_enabled": True,
        "health": {"ok": up, "latency_s": 1.02 if up else 5.1},
        "load": {"running": 2 if up else 0, "queued": (step * 3) % 7 if up else 9, "token_usage": 0.3,
                 "gen_tokens_per_s": 40.0 + 10 * (step % 4) if up else 0.0, "prompt_tokens_per_s": 300.0},
    }


def engine_documents(count: int = 12) -> list[dict[str, Any]]:
    docs = documents(count, out="/tmp/hsmon-tui-snapshot/out", model="embedded")
    for step, doc in enumerate(docs):
        doc["gpus"] = copy.deepcopy(GPUS)
        doc["jobs"][0]["servers"] = [server("http://127.0.0.1:30000", "up", step),
                                     server("http://10.0.0.7:30000", "hung", step)]
    return docs


def test_spark_scales_to_the_maximum_and_keeps_the_last_values():
    assert spark([0, 1, 2, 4], 10) == "▁▃▅█"
    assert spark([5, 0, 0], 2) == "▁▁"
    assert spark([], 5) == "" and spark([0, 0], 5) == "▁▁"


def test_server_and_gpu_lines_fit_the_width_and_say_what_matters():
    history = JobHistory()
    docs = engine_documents(4)
    for doc in docs:
        history.add(typed(doc).jobs[0], doc["generated_ts"])
    lines = [line for t in server_lines(typed(docs[-1]).jobs[0], history, 70) for line in t.plain.split("\n")]
    assert lines[0].startswith(" UP    127.0.0.1:30000  run 2 queue 2  70.0 tok/s  fwd 1.0s")
    # the whole run in the cells there are: 4 readings a second apart, each a stretch of time
    assert re.fullmatch(r"   queue ▁+▅+█+▃+ *tok/s ▅+▆+▇+█+", lines[1]), lines[1]
    assert lines[2].startswith(" HUNG  10.0.0.7:30000  the HTTP front answers but /health_generate")
    assert all(len(line) <= 70 for line in lines)
    gpus = [t.plain for t in gpu_lines(typed_as(GPUS, GpuSection), 70)]
    assert gpus[0].startswith("GPU0 ━━━━") and gpus[0].endswith(" 97%  66.6/80G  612W 66C")
    assert gpus[1].startswith("GPU1 ────") and gpus[1].endswith("   0%  66.6/80G 41C")
    assert all(len(line) == 70 for line in gpus)
    absent = gpu_lines(typed_as({"available": False, "reason": "NVML is not usable here (no driver)"},
                                GpuSection), 30)
    assert [t.plain for t in absent] == ["GPUs: NVML is not usable here…"]


async def _shown(pilot: Pilot, docs: list[dict[str, Any]]) -> None:
    app = pilot.app
    for _ in range(200):
        if shown_ts(app) == docs[-1]["generated_ts"] and app.query("JobOverview"):
            break
        await pilot.pause(0.05)
    await pilot.pause(0.3)
    app.screen.query_one(EnginePanel).scroll_visible(animate=False)
    await pilot.pause(0.2)
    await pilot.wait_for_scheduled_animations()


@pytest.mark.asyncio
async def test_panel_shows_badges_queue_and_gpus_and_hides_without_an_engine() -> None:
    docs = engine_documents()
    app = HsmonApp([fixed_source(docs, label="fixture")])
    async with app.run_test(size=(80, 24)) as pilot:
        await _shown(pilot, docs)
        panel = app.screen.query_one(EnginePanel)
        assert panel.display and panel.region.width <= 80
        text = "\n".join(strip.text for strip in app.screen._compositor.render_strips())
        assert "servers and GPUs" in text and " HUNG " in text and " UP " in text
        assert "queue" in text and "tok/s" in text
        assert panel.history.server_queued["http://127.0.0.1:30000"].added == len(docs)
    plain = documents(3)
    app = HsmonApp([fixed_source(plain, label="fixture")])
    async with app.run_test(size=(80, 24)) as pilot:
        for _ in range(200):
            if shown_ts(app) == plain[-1]["generated_ts"] and app.query("JobOverview"):
                break
            await pilot.pause(0.05)
        await asyncio.sleep(0.2)
        assert app.screen.query_one(EnginePanel).display is False


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_engine_panel_snapshot(snap_compare, size: tuple[int, int]) -> None:
    Path("/tmp/hsmon-tui-snapshot/out").mkdir(parents=True, exist_ok=True)
    docs = engine_documents()

    async def shown(pilot: Pilot) -> None:
        await _shown(pilot, docs)

    assert snap_compare(HsmonApp([fixed_source(docs, label="fixture")]), terminal_size=size, run_before=shown)


@pytest.mark.asyncio
async def test_engine_panel_resized_before_its_first_document() -> None:
    """A pane mounted during a layout pass (a tab added or removed) gets a resize before any
    document: it draws nothing instead of failing on the job it does not have yet."""
    from textual.app import App

    from hsmon.tui.widgets.engine_panel import EnginePanel

    app = App()
    async with app.run_test() as pilot:
        panel = EnginePanel()
        await app.mount(panel)
        panel.on_resize()
        assert panel.render().plain == ""
        await pilot.pause()


def test_a_speculative_server_gets_a_drafter_line_red_below_half_its_estimate():
    history = JobHistory()
    doc = engine_documents(1)[0]
    good, bad = doc["jobs"][0]["servers"]
    bad["state"] = "up"
    good["speculative"] = {"algorithm": "EAGLE3", "depth": 3, "accept_length": 1.82, "accept_rate": 0.27,
                           "estimate": 2.63}
    bad["speculative"] = {"algorithm": "EAGLE3", "depth": 3, "accept_length": 1.04, "estimate": 2.63}
    lines = server_lines(typed(doc).jobs[0], history, 100)
    drafter = [t for t in lines if t.plain.startswith("   drafter")]
    assert [t.plain for t in drafter] == [
        "   drafter EAGLE3 depth 3: 1.82 tokens per verify (rate 0.27), the drafter's estimate 2.63",
        "   drafter EAGLE3 depth 3: 1.04 tokens per verify, the drafter's estimate 2.63 (below 50% of it)",
    ]
    assert str(drafter[0].style) == "grey70" and str(drafter[1].style) == "bold red"

"""The capture plugin's counters on the servers panel (the TUI part): `servers[i].capture`
as /work/notes/capture-contract.md names it, one compact line under the server's figures."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from test_tui_engine import _shown, engine_documents
from tui_complete import fixed_source, typed, typed_as

from hsmon.status_doc import Capture
from hsmon.tui.app import HsmonApp
from hsmon.tui.engine_view import capture_line, server_lines
from hsmon.tui.view import JobHistory
from hsmon.tui.widgets.engine_panel import EnginePanel

CAPTURE = {"schedulers": 2, "plugin_version": "0.1.0", "requests": 1250, "files_written": 1234,
           "write_errors": 0, "sync_fallbacks": 0, "queue_depth": 2, "pool_bytes_in_use": 120_000_000,
           "pool_bytes_max": 512_000_000, "write_seconds": 41.5, "hook_seconds": 0.62,
           "hook_seconds_p50": 0.00031, "hook_seconds_p99": 0.0021, "read_ts": 1764489600.0,
           "buffer_reuses": 0}


def with_capture(capture: dict[str, Any] | None) -> list[dict[str, Any]]:
    docs = engine_documents()
    for doc in docs:
        doc["jobs"][0]["servers"][0]["capture"] = copy.deepcopy(capture)
        doc["jobs"][0]["servers"][1]["capture"] = None  # no plugin on that server
    return docs


def test_the_counters_fit_one_line_and_trouble_is_coloured() -> None:
    line = capture_line(typed_as(CAPTURE, Capture), 100)
    assert line is not None
    assert line.plain == ("   capture q 2  pool 120.0 MB of 512.0 MB  files 1,234  sync 0  err 0  "
                          "hook p99 2.1 ms")
    assert not any("red" in str(span.style) or "yellow" in str(span.style) for span in line.spans)
    trouble = CAPTURE | {"write_errors": 3, "sync_fallbacks": 7, "buffer_reuses": 1}
    bad = capture_line(typed_as(trouble, Capture), 100)
    assert bad is not None
    assert "sync 7  err 3  buffer reuses 1" in bad.plain
    styles = {bad.plain[span.start:span.end].strip(): str(span.style) for span in bad.spans}
    assert styles["err 3"] == "bold red" and styles["sync 7"] == "bold yellow"
    assert styles["buffer reuses 1"] == "bold red"
    narrow = capture_line(typed_as(CAPTURE, Capture), 40).plain.splitlines()  # on the lines it needs
    assert narrow == ["   capture q 2", "           pool 120.0 MB of 512.0 MB",  # each figure whole,
                      "           files 1,234  sync 0  err 0", "           hook p99 2.1 ms"]  # never "5.…"
    assert capture_line(None, 100) is None


def test_server_lines_carry_the_capture_line_of_a_server_with_the_plugin_only() -> None:
    docs = with_capture(CAPTURE)
    history = JobHistory()
    job = typed(docs[-1]).jobs[0]
    history.add(job, docs[-1]["generated_ts"])
    lines = [t.plain for t in server_lines(job, history, 100)]
    assert lines[0].startswith(" UP ") and lines[1].startswith("   capture q 2")
    assert lines[2].startswith("   queue ") and lines[3].startswith(" HUNG ")
    assert not any("capture" in line for line in lines[3:])


@pytest.mark.asyncio
async def test_the_overview_shows_the_counters() -> None:
    docs = with_capture(CAPTURE | {"sync_fallbacks": 4})
    app = HsmonApp([fixed_source(docs, label="fixture")])
    async with app.run_test(size=(160, 48)) as pilot:
        await _shown(pilot, docs)
        assert app.screen.query_one(EnginePanel).display
        text = "\n".join(strip.text for strip in app.screen._compositor.render_strips())
        assert "capture q 2  pool 120.0 MB of 512.0 MB  files 1,234  sync 4  err 0" in text

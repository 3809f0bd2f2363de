"""The data panel (the TUI part): per layer a norm sparkline over chunks and its
NaN/Inf rows, the last engine-verify verdict; an alarm only when something is wrong."""

from __future__ import annotations

import pytest
import tui_data_documents as data_docs
from textual.pilot import Pilot
from tui_complete import fixed_source, typed_as
from tui_screen_text import screen_lines

from hsmon.status_doc import DataSection
from hsmon.tui.app import HsmonApp
from hsmon.tui.data_view import data_alarm, data_text
from hsmon.tui.widgets.data_panel import DataPanel


def section(bad: bool, verify: dict | None) -> DataSection:
    return typed_as(data_docs.data_section(bad, verify), DataSection)


def test_a_bad_run_names_its_nan_rows_and_the_disagreement() -> None:
    text = data_text(section(True, data_docs.DISAGREE), 76).plain
    lines = text.splitlines()
    assert [line.split()[0] for line in lines[:4]] == ["2", "4", "5", "final"]
    assert all("NaN/Inf 2" in line for line in lines[:4])
    assert all(any(c in line for c in "▁▂▃▄▅▆▇█") for line in lines[:4])
    assert "NaN/Inf in 2 rows: rows 3, 9" in text
    assert ("verify:  DISAGREE  rows_270-300, 4 rows, cos 0.8123, max diff 4.8\n"
            "  10 checks, 3 disagreed") in text
    assert lines[-1] == "  layers 5, final differ: cosine 0.8123 < 0.999"
    assert max(len(line) for line in lines) <= 76  # cut nowhere at 80 columns
    wide = data_text(section(True, data_docs.DISAGREE), 150).plain
    assert "max diff 4.8 (10 checks, 3 disagreed)\n" in wide
    assert data_alarm(section(True, data_docs.DISAGREE))
    assert data_alarm(section(False, data_docs.DISAGREE))  # a disagreement alone is an alarm
    assert data_alarm(section(True, None))


def test_a_clean_run_shows_no_alarm_and_verify_off_when_not_checked() -> None:
    clean = section(False, data_docs.AGREE)
    assert not data_alarm(clean)
    text = data_text(clean, 76).plain
    assert "NaN/Inf 0" in text and "NaN/Inf in" not in text
    assert "verify:  AGREE  rows_270-300, 4 rows, cos 1.0000" in text
    assert "verify: off" in data_text(section(False, None), 76).plain
    running = data_docs.AGREE | {"verdict": "running", "rows_checked": 0, "worst_cosine": None,
                                 "max_abs_diff": None, "checks_total": 0}
    assert "verify:  RUNNING  rows_270-300" in data_text(section(False, running), 76).plain


def run_app(bad: bool, verify: dict | None) -> HsmonApp:
    return HsmonApp([fixed_source(data_docs.documents(bad, verify), label="127.0.0.1:9108")])


async def shown(pilot: Pilot) -> None:
    app = pilot.app
    for _ in range(200):
        if app.query(DataPanel) and app.query_one(DataPanel).display and 0 in app.documents:
            break
        await pilot.pause(0.05)
    await pilot.pause(0.3)


@pytest.mark.asyncio
async def test_the_panel_on_the_overview_alarms_only_for_a_bad_run() -> None:
    for bad, verify, alarm in ((True, data_docs.DISAGREE, True), (False, data_docs.AGREE, False)):
        app = run_app(bad, verify)
        async with app.run_test(size=(160, 48)) as pilot:
            await shown(pilot)
            panel = app.query_one(DataPanel)
            assert panel.display and panel.has_class("-alarm") is alarm
            text = "\n".join(screen_lines(app.export_screenshot()))
            assert ("DISAGREE" in text) is bad and ("AGREE" in text)
            assert ("NaN/Inf in 2 rows" in text) is bad


def test_snapshot_of_a_bad_run(snap_compare) -> None:
    assert snap_compare(run_app(True, data_docs.DISAGREE), terminal_size=(160, 48), run_before=shown)

"""Snapshots of the main screens at 80x24, 120x40 and 160x48, from fixed status documents.

Every figure on screen derives from the documents (their own generated_ts), so the pictures are the
same on every run. Update after an intended change: pytest tests/test_tui_snapshots.py --snapshot-update
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tui_run_documents as run_documents
from textual.pilot import Pilot
from tui_complete import fixed_source, shown_ts
from tui_documents import documents
from tui_screen_text import empty_rows_above_footer, long_floats, screen_lines

from hsmon.contracts.layout import MANIFEST_NAME
from hsmon.tui.app import HsmonApp

# A fixed path (not tmp_path): it is printed in the form, and the form checks that it exists.
DATA_DIR = Path("/tmp/hsmon-tui-snapshot/out")
SIZES = [(80, 24), (120, 40), (160, 48)]


@pytest.fixture(scope="module", autouse=True)
def data_dir() -> Path:
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    (DATA_DIR / MANIFEST_NAME).write_text('{"type": "run"}\n')
    return DATA_DIR


def make_app() -> HsmonApp:
    return HsmonApp([fixed_source(documents(12, out=str(DATA_DIR), model="embedded"), label="fixture")])


async def all_documents_shown(pilot: Pilot) -> None:
    app = pilot.app
    for _ in range(200):
        history = app.histories.get((0, "extract"))
        if history is not None and history.rows_per_s.added == 12 and app.query("JobOverview"):
            break
        await pilot.pause(0.05)
    await pilot.pause(0.2)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_overview(snap_compare, size: tuple[int, int]) -> None:
    assert snap_compare(make_app(), terminal_size=size, run_before=all_documents_shown)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_training(snap_compare, size: tuple[int, int]) -> None:
    async def to_training(pilot: Pilot) -> None:
        await all_documents_shown(pilot)
        await pilot.press("t")
        await pilot.pause(0.3)

    assert snap_compare(make_app(), terminal_size=size, run_before=to_training)


def test_help(snap_compare) -> None:
    async def to_help(pilot: Pilot) -> None:
        await all_documents_shown(pilot)
        await pilot.press("question_mark")
        await pilot.pause(0.3)

    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=to_help)


def test_training_errors_inline(snap_compare) -> None:
    async def bad_fields(pilot: Pilot) -> None:
        await all_documents_shown(pilot)
        await pilot.press("t")
        await pilot.pause(0.2)
        pilot.app.screen.query_one("#field-epochs").value = "0"
        pilot.app.screen.query_one("#field-lr").value = "fast"
        await pilot.pause(0.3)

    assert snap_compare(make_app(), terminal_size=(80, 24), run_before=bad_fields)


# A whole small run as `make demo` shows it (tests/tui_run_documents.py), at the three sizes a
# person uses. Besides the pictures: no float printed with more than 4 significant digits, and at
# 120x40 the panels use the height (at most 2 empty rows above the footer).
RUN_SIZES = [(80, 24), (120, 40), (160, 48)]
RUNS = {
    "running_extraction": (run_documents.running_extraction, ()),
    "finished_extraction": (run_documents.finished_extraction, ()),
    "finished_training": (run_documents.finished_training, ("t",)),
}


@pytest.mark.parametrize("size", RUN_SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("run", list(RUNS))
def test_run(snap_compare, run: str, size: tuple[int, int]) -> None:
    make_documents, keys = RUNS[run]
    docs = make_documents()
    seen: list[str] = []

    async def shown(pilot: Pilot) -> None:
        app = pilot.app
        for _ in range(200):
            if shown_ts(app) == docs[-1]["generated_ts"] and app.query("JobOverview"):
                break
            await pilot.pause(0.05)
        await pilot.pause(0.2)
        for key in keys:
            await pilot.press(key)
            await pilot.pause(0.3)
        await pilot.wait_for_scheduled_animations()
        seen.extend(screen_lines(app.export_screenshot()))

    app = HsmonApp([fixed_source(docs, label="127.0.0.1:9108")])
    assert snap_compare(app, terminal_size=size, run_before=shown)
    assert len(seen) == size[1] and "quit" in seen[-1], seen
    assert not long_floats(seen), long_floats(seen)
    if size == (120, 40):
        assert empty_rows_above_footer(seen) <= 2, "\n".join(seen)

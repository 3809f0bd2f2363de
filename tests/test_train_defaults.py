"""`hsmon train`'s defaults are one set, the documented one, in the command line, the TUI's form and
the daemon's launch API; the form has every field the launch API takes; a run that learnt nothing
says "no speed-up yet" in the TUI (its last line: tests/test_train.py)."""

from __future__ import annotations

import argparse
import copy
import re
from pathlib import Path

import pytest
import tui_run_documents as run_documents
from test_tui_pilot import running, screen_text, wait_for
from tui_complete import fixed_source

from hsmon.contracts import train_defaults
from hsmon.launch import training as launch
from hsmon.tui import view
from hsmon.tui.event_text import event_summary
from hsmon.tui.widgets.training_form import FIELDS as FORM_FIELDS
from hsmon.tui.widgets.training_form import FOLLOW_FIELDS
from trainer import cli as train_cli

ROOT = Path(__file__).resolve().parent.parent
ADVICE = train_defaults.no_speedup_advice(1.004, lr=1e-4)


def documented_defaults() -> dict[str, str]:
    """The default column of docs/train.md's option table, by option."""
    table = (ROOT / "docs" / "train.md").read_text()
    return {m[1]: m[2].strip() for m in re.finditer(r"^\| `(--[a-z-]+)[^`]*` \| ([^|]*) \|", table, re.M)}


def test_the_cli_and_the_form_default_to_the_documented_training():
    parser = argparse.ArgumentParser()
    train_cli.add_arguments(parser)
    args = parser.parse_args(["data", "--out", "out"])
    docs = documented_defaults()
    assert float(docs["--lr"]) == args.lr == train_defaults.LR == 2e-3
    assert int(docs["--epochs"]) == train_defaults.EPOCHS == 4 and args.epochs is None  # None: EPOCHS
    assert int(docs["--batch-tokens"]) == args.batch_tokens == train_defaults.BATCH_TOKENS
    assert int(docs["--ttt-length"]) == args.ttt_length == train_defaults.TTT_LENGTH
    assert "cover 99 %" in docs["--draft-vocab-size"] and args.draft_vocab_size is None
    form = view.training_defaults(None)
    assert float(form["lr"]) == args.lr and int(form["epochs"]) == train_defaults.EPOCHS
    assert int(form["batch_tokens"]) == args.batch_tokens and int(form["ttt_length"]) == args.ttt_length
    assert form["draft_vocab_size"] == ""  # sized to the data by the trainer
    said = re.search(r"defaults of `hsmon train` \(epochs (\d+),\s+lr ([0-9.e-]+),",
                     (ROOT / "docs" / "tui.md").read_text())
    assert said and int(said[1]) == train_defaults.EPOCHS and float(said[2]) == train_defaults.LR


def test_the_form_has_every_field_of_the_launch_api_time_limit_and_threads_included():
    names = [name for name, _, _ in FORM_FIELDS]
    # resume is the form's Resume button (it sends resume: yes); restart, removing a run's
    # checkpoints, is left to the command line and the API, not one field away from Launch
    typed = set(launch.FIELDS) - {"resume", "restart"}
    assert set(names) == typed and {"time_limit", "threads"} <= set(names)
    assert set(view.training_defaults(None)) == typed
    assert not {"time_limit", "threads"} & set(FOLLOW_FIELDS)  # shown for every training


def test_no_speedup_advice_names_what_to_change():
    assert ADVICE is not None and ADVICE.startswith("no speed-up yet: estimated acceptance length 1.004")
    assert "raise --lr (this run 0.0001, default 0.002)" in ADVICE
    assert train_defaults.no_speedup_advice(1.5, lr=1e-4) is None  # learnt enough
    assert train_defaults.no_speedup_advice(None) is None
    assert "--lr" not in (train_defaults.no_speedup_advice(1.0, lr=2e-3) or "--lr")
    assert "more --passes" in (train_defaults.no_speedup_advice(1.0, epochs_or_passes="--passes") or "")


def _training_without_speedup() -> list[dict]:
    docs = copy.deepcopy(run_documents.finished_training())
    for doc in docs:
        for job in doc["jobs"]:
            for event in job.get("recent_events", []):
                if event.get("kind") == "done" and "step" in event:
                    event.update(accept_len_est=1.004, advice=ADVICE)
    return docs


def test_the_event_log_line_of_such_a_done_carries_the_advice():
    done = {"v": 1, "ts": 1.0, "job": "t", "kind": "done", "step": 1, "tokens": 900, "advice": ADVICE}
    assert event_summary(done).endswith(ADVICE)


@pytest.mark.asyncio
async def test_the_training_tab_says_no_speed_up_yet():
    async with running([fixed_source(_training_without_speedup(), label="fixture")], size=(160, 48)) as (
        app, pilot,
    ):
        await pilot.press("t")
        await wait_for(pilot, lambda: "no speed-up yet" in screen_text(app))
        assert "raise --lr" in screen_text(app)

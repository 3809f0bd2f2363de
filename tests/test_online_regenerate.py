"""`hsmon online --regenerate`: the target's own answers, then their hidden states, then the drafter,
one command of real processes (the embedded target), each side watched by the daemon it starts."""

from __future__ import annotations

import subprocess
import sys

from regen_helpers import chat_rows, dataset_rows, env, write_rows

from hsmon.contracts import events as ev
from hsmon.contracts import layout, regen_layout

ROWS = 8


def test_online_starts_from_a_regeneration_each_side_watched(tmp_path):
    data = write_rows(tmp_path / "chat.jsonl", chat_rows(ROWS, start=90))
    out = tmp_path / "online"
    proc = subprocess.run(
        [sys.executable, "-m", "hsmon", "online", str(data), "--out", str(out), "--regenerate",
         "--regenerate-arg=--max-new-tokens=24", "--chunk-size", "4", "--threads", "2", "--daemon",
         "--train-arg=--max-steps=2", "--train-arg=--batch-tokens=512"],
        # each training step lasts 3 s: the online side is seen running whatever the machine's
        # speed (its running window was a second or two: a daemon tick could miss it)
        capture_output=True, text=True, timeout=600, env=env(HSMON_TRAIN_STEP_DELAY_S="3"),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"regeneration done: {ROWS} / {ROWS} rows" in proc.stdout, proc.stdout
    regen = out / "regen"
    assert regen_layout.unfinished_reason(regen) is None and len(dataset_rows(regen)) == ROWS
    # the extraction read the target's own answers: its manifest's dataset is the regeneration's
    run = next(layout.iter_jsonl(out / "spool" / layout.MANIFEST_NAME))
    assert run["settings"]["dataset"] == str((regen / regen_layout.DATA_NAME).resolve())
    assert (out / "drafter" / "checkpoints").is_dir()
    # one daemon watched both: the regeneration as a job of its own, then the online job
    config = (out / "hsmon.toml").read_text()
    assert 'name = "regenerate"' in config and 'kind = "regenerate"' in config and 'name = "online"' in config
    states = [ev.parse_event_line(line) for line in (out / "daemon.log").read_text().splitlines()]
    ended = {(e["job"], e["state"]) for e in states if e and e.get("kind") == "state"}
    assert ("regenerate", "done") in ended and ("regenerate", "running") in ended, ended
    assert ("online", "running") in ended, ended

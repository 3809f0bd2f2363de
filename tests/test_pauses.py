"""One pause protocol for disk, shm and server (hsmon/contracts/pauses.py): each reason begins and ends
once, and one reason's resume never clears another's pause."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from extractor.writer import ChunkBook, Progress, RowWriter
from hsmon.contracts import events as ev
from hsmon.contracts.pauses import Pause


def kinds(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_pause_begins_and_ends_once_with_its_seconds_and_fields(tmp_path: Path, capsys) -> None:
    events_path = tmp_path / "events.jsonl"
    progress = Progress()
    with ev.EventWriter("j", path=str(events_path)) as events:
        pause = Pause("shm", events, progress)
        assert pause.end("nothing to end") is None
        assert pause.begin("full", "room", 0.2, path="/dev/shm/x") is True
        assert pause.begin("full again", "room", 0.2) is False
        assert progress.paused == "shm" and pause.active
        assert pause.end("room again", path="/dev/shm/x") is not None
        assert pause.end("twice") is None
    said = kinds(events_path)
    assert [e["kind"] for e in said] == ["pause", "resume"]
    assert said[0]["reason"] == "shm" and said[0]["path"] == "/dev/shm/x"
    assert said[1]["paused_seconds"] >= 0 and progress.paused is None
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "hsmon extract: paused (shm): full; waiting for room, checking every 0.2s"
    assert lines[1].startswith("hsmon extract: resumed (shm) after ") and lines[1].endswith(": room again")


def test_the_writer_does_not_resume_a_pause_that_is_not_its_own(tmp_path: Path) -> None:
    # The dump dir (shm) paused the run; the output disk has room. The writer's next write must not
    # say "resume (disk)" nor clear the shm pause (it did, when each place kept its own flag logic).
    events_path = tmp_path / "events.jsonl"
    progress = Progress()
    with ev.EventWriter("j", path=str(events_path)) as events:
        shm = Pause("shm", events, progress)
        shm.begin("full", "room", 0.2)
        writer = RowWriter(tmp_path, tmp_path / "manifest.jsonl", ChunkBook(10, {0: 1}), [2], events,
                           progress, threading.Event(), min_free=0)
        writer.append([{"type": "run"}])
        assert progress.paused == "shm"
        disk = Pause("disk", events, progress)
        disk.begin("disk full", "room", 1.0)  # a second reason while the first holds the flag
        assert progress.paused == "shm"
        disk.end("room")
        assert progress.paused == "shm"
        shm.end("room again")
        assert progress.paused is None
    said = [(e["kind"], e["reason"]) for e in kinds(events_path)]
    assert said == [("pause", "shm"), ("pause", "disk"), ("resume", "disk"), ("resume", "shm")]

"""The typed status document (hsmon/status_doc/): a document recorded from the real Monitor reads
into the types and encodes back to the same JSON (a field the types lack would be dropped on the
way), the sections a recording leaves null round-trip from their real producers, and the JSON
Schema in docs is the one the types generate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from hsmon import status_doc as sd

REPO = Path(__file__).resolve().parent.parent
RECORDED = REPO / "tests" / "fixtures" / "status_document.json"  # tests/record_status_document.py
SCHEMA = REPO / "docs" / "status-schema.json"


def test_a_recorded_document_reads_into_the_types_and_encodes_to_the_same_json() -> None:
    text = RECORDED.read_text()
    recorded = json.loads(text)
    doc = sd.decode(text)
    assert isinstance(doc.jobs[0], sd.JobStatus) and doc.jobs[0].servers[0].capture is not None
    assert json.loads(sd.encode(doc)) == recorded
    # same keys in the same order, ints staying ints: the text itself is today's
    assert json.dumps(json.loads(sd.encode(doc))) == json.dumps(recorded)
    # every section is filled in the recording, so that a field missing from a type shows here
    ext, train, written = doc.jobs
    assert ext.dump and ext.output and ext.events and ext.progress and ext.servers and ext.disk
    assert ext.servers[0].info and ext.servers[0].load.token_usage is not None
    assert train.training and train.training.total_steps is not msgspec.UNSET
    assert written.hints and written.output and written.output.data
    assert written.output.data.layers["final"].chunk and written.output.data.layers["final"].history
    assert doc.gpus.devices and doc.gpus.devices[0].processes and ext.gpu.indices


def test_a_document_missing_a_field_is_refused_naming_it() -> None:
    recorded = json.loads(RECORDED.read_text())
    del recorded["jobs"][0]["progress"]["eta_s"]
    with pytest.raises(msgspec.ValidationError, match=r"eta_s.*\$\.jobs\[0\]\.progress"):
        sd.from_builtins(recorded)


def test_the_engine_check_section_round_trips_from_its_producer() -> None:
    from hsmon.core.verify_watch import VerifyResult

    result = VerifyResult(verdict="disagree", chunk="rows_0-100", rows_checked=4, worst_cosine=0.91,
                          max_abs_diff=3.5, against="hf", checked_ts=1.0, seconds=2.5, reason="cosine",
                          checks_total=2, disagreements_total=1,
                          checks_by_verdict={"agree": 1, "disagree": 1})
    section = sd.from_builtins(result.as_dict(), sd.VerifySection)
    assert sd.to_builtins(section) == result.as_dict()


def test_the_training_sections_optional_fields_round_trip_from_the_progress_tracker(tmp_path) -> None:
    from hsmon.contracts import events as ev
    from hsmon.core.trackers.progress import ProgressTracker

    path = tmp_path / "train.jsonl"
    with ev.EventWriter("train", path) as writer:
        writer.emit(ev.START, total_steps=100)
        writer.emit(ev.STEP, step=3, epoch=0, total_steps=100, lr=1e-4, grad_norm=0.5,
                    data_wait_frac=0.01, loss=2.5, losses=[2.0, 3.0], accs=[0.5, 0.25], tokens_per_s=900.0)
        writer.emit(ev.CHECKPOINT, path="/ckpt-3")
        writer.emit(ev.EVAL, acceptance_length={"eagle3": {"1": 1.5}})
    tracker = ProgressTracker(str(path))
    tracker.poll()
    snap = sd.to_builtins(tracker.snapshot(now=2e9).training)
    training = sd.from_builtins(snap, sd.TrainingSection)
    assert training.lr == 1e-4 and training.eval == {"acceptance_length": {"eagle3": {"1": 1.5}}}
    assert sd.to_builtins(training) == snap
    # a training that sends none of them: the keys stay absent, as today
    bare = {"step": 1, "epoch": None, "loss": None, "acc": None, "tokens_per_s": None,
            "last_checkpoint": None, "eta_s": None}
    assert sd.to_builtins(sd.from_builtins(bare, sd.TrainingSection)) == bare


def test_the_output_section_while_its_manifest_is_read_and_for_other_layouts() -> None:
    recorded = json.loads(RECORDED.read_text())
    out = recorded["jobs"][0]["output"]
    reading = {**out, "chunks_complete": None, "chunks_in_progress": None, "rows": None, "tokens": None,
               "bytes": None, "temp_files": None, "reading": {"bytes_done": 10, "bytes_total": 30}}
    assert sd.to_builtins(sd.from_builtins(reading, sd.OutputSection)) == reading
    specforge = {k: v for k, v in out.items() if k not in ("rejects", "rejects_by_reason", "data")}
    specforge.update(layout="specforge", tokens=None)
    assert sd.to_builtins(sd.from_builtins(specforge, sd.OutputSection)) == specforge


def test_the_schema_in_docs_is_the_one_the_types_generate() -> None:
    generated = subprocess.run([sys.executable, "-m", "hsmon.status_doc", "--schema"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout
    assert json.loads(SCHEMA.read_text()) == json.loads(generated), (
        "docs/status-schema.json is stale: `python -m hsmon.status_doc --schema > docs/status-schema.json`")
    schema = json.loads(generated)
    job = schema["$defs"]["JobStatus"]
    assert {"state", "progress", "output", "servers", "gpu"} <= set(job["required"])
    assert "lr" not in schema["$defs"]["TrainingSection"]["required"]


def test_hsmon_status_renders_every_section_of_the_typed_document() -> None:
    from hsmon.status.cli import render
    from hsmon.status.table import render_many

    doc = sd.decode(RECORDED.read_bytes())
    text = render(doc)
    for expected in ("extract [extract]: RUNNING", "69 / 100000 (0.1 %)", "dump", "disk shm",
                     "events", "server http://127.0.0.1:", "KV 19 %",
                     "step 21 / 10.0k, epoch 0", "figures   loss 0.095 (pos 0)",
                     "! warning: the extractor process ended", "gpu 0  NVIDIA H100 80GB HBM3: util 97 %"):
        assert expected in text, (expected, text)
    table = render_many([("http://a:1", doc, None), ("http://b:2", None, "down")])
    assert "step 21/10000" in table and "245/300 (82 %)" in table and "UNREACHABLE" in table


def test_hsmon_status_and_the_dashboard_give_a_disk_the_same_verdict() -> None:
    """One verdict function (hsmon/status/text.py) for both: a disk that holds what is left but fills
    at the current write rate before the job is done says so in `hsmon status` too."""
    from hsmon.status.cli import render
    from hsmon.tui.view import disk_lines

    doc = sd.decode(RECORDED.read_bytes())
    disk = doc.jobs[0].disk[0]
    for ttf, expected in ((60.0, "fills before done"), (1e9, "fits")):
        filled = msgspec.structs.replace(disk, time_to_full_s=ttf, time_to_done_s=600.0)
        job = msgspec.structs.replace(doc.jobs[0], disk=[filled])
        line = next(ln for ln in render(msgspec.structs.replace(doc, jobs=[job])).splitlines()
                    if "disk output" in ln)
        assert f", {expected}; full in" in line, line
        assert disk_lines([filled])[0].verdict == expected
    unknown = msgspec.structs.replace(disk, fits=None, time_to_full_s=None)
    job = msgspec.structs.replace(doc.jobs[0], disk=[unknown])
    assert ", fit unknown; full in" in render(msgspec.structs.replace(doc, jobs=[job]))


@pytest.mark.parametrize("state", ["done", "stopped"])
def test_an_ended_job_shows_no_disk_projection(state: str) -> None:
    """A finished extraction's last minute of writes projected the disk full "in 4h09m": an ended
    job writes no more, so the document carries no time to full nor to done, and neither `hsmon
    status` nor the dashboard shows one, even for a document an older daemon wrote with them."""
    from hsmon.core.config import JobConfig
    from hsmon.core.job_document import JobState, Sections, job_status
    from hsmon.status.cli import render

    doc = sd.decode(RECORDED.read_bytes())
    disk = msgspec.structs.replace(doc.jobs[0].disk[0], time_to_full_s=14_940.0, time_to_done_s=0.0)
    made = job_status(JobConfig(name="extract", out_dir="/o"), JobState(1.0, state=state),
                      Sections(disk=[disk]))
    assert [(d.time_to_full_s, d.time_to_done_s) for d in made.disk] == [(None, None)]
    assert made.disk[0].free_bytes == disk.free_bytes  # the headroom itself stays
    running = msgspec.structs.replace(doc.jobs[0], disk=[disk])
    assert "full in 4h09m" in render(msgspec.structs.replace(doc, jobs=[running]))
    stale = msgspec.structs.replace(running, state=state)
    text = render(msgspec.structs.replace(doc, jobs=[stale]))
    line = next(ln for ln in text.splitlines() if "disk output" in ln)
    assert "full in" not in line and "done in" not in line and "free, needs" in line, line

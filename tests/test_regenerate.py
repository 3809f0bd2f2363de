"""`hsmon regenerate` in-process (transformers) on the embedded target, greedy, 24 new tokens, as real
subprocesses: every answer equals transformers' own greedy generation; a run killed with -9 half-way
and resumed equals an uninterrupted one, each row once, in source order; rows that cannot be answered
are rejects with a reason; one writer per output; a stop by signal; a full disk pauses the run; the
terminal shows a progress line."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from extract_helpers import events_of, small_disk, wait_for_event  # noqa: F401 (small_disk: a fixture)
from regen_helpers import (
    BAD_ROWS,
    EMBEDDED,
    answers_of,
    chat_rows,
    dataset_rows,
    manifest,
    regen_cmd,
    run_regenerate,
    start_regenerate,
    transformers_answers,
    write_rows,
)

from hsmon.contracts import layout, regen_layout

ROWS = 8


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("regenerate")


@pytest.fixture(scope="module")
def data(workdir):
    """Eight conversations of every shape, with four rows that cannot be answered among them."""
    rows = chat_rows(ROWS)
    return write_rows(workdir / "chat.jsonl", rows, BAD_ROWS, bad_every=2), rows


@pytest.fixture(scope="module")
def reference(workdir, data):
    """The uninterrupted run."""
    out, events = workdir / "reference", workdir / "reference.jsonl"
    proc = run_regenerate(data[0], out, events=events)
    assert proc.returncode == 0, proc.stderr
    return out, events, proc.stderr


def test_each_answer_equals_transformers_greedy_generation(data, reference):
    _, rows = data
    out, events, stderr = reference
    got = dataset_rows(out)
    assert [r["id"] for r in got] == [r["id"] for r in rows]  # the valid rows, in source order
    assert [answers_of(r) for r in got] == transformers_answers(rows)
    # the turns around the answers are kept (system turns, the user turns in OpenAI names)
    assert got[2]["conversations"][0] == {"role": "system", "content": "Answer with code only."}
    assert [m["role"] for m in got[1]["conversations"]] == ["user", "assistant", "user", "assistant"]
    assert [m["role"] for m in got[3]["conversations"]] == ["user", "assistant"]  # an answer appended
    records = manifest(out)
    run = records[0]
    assert run["type"] == "run" and run["provenance"]["engine"] == "transformers"
    assert run["provenance"]["sampling"]["temperature"] == 0 and run["provenance"]["seed_rule"]
    turns = {r["row"]: r["turns"] for r in records if r["type"] == "row"}
    for turn_list in turns.values():
        assert all(t["finish"] in ("stop", "length") and 0 < t["tokens"] <= 24 for t in turn_list)
    by_row = {r["row"]: r for r in records if r["type"] == "row"}
    first = min(by_row)
    assert by_row[first]["turns"][0]["source_tokens"] > 0
    appended = [r for r in by_row.values() if r["turns"][-1]["source_tokens"] is None]
    assert len(appended) == ROWS // 4  # the rows that ended with a user turn
    # rows that cannot be answered: rejects with their reasons, in the rejects file and the manifest
    reasons = {r["row"]: r["reason"] for r in layout.iter_jsonl(out / "rejects.jsonl")}
    assert sorted(reasons.values(), key=str) == sorted(reasons.values(), key=str) and len(reasons) == 4
    said = " | ".join(reasons.values())
    assert "starts with an assistant turn" in said and "no user turn: nothing to answer" in said
    assert "no user turn: a text row" in said and "invalid JSON" in said
    done = records[-1]
    assert done["type"] == "done" and done["rows"] == ROWS and done["rejects"] == 4
    assert "done: 8 rows" in stderr and "mean answer" in stderr
    kinds = [e["kind"] for e in events_of(events)]
    assert kinds[0] == "start" and kinds[-1] == "done" and "rows" in kinds
    start = events_of(events)[0]
    assert start["task"] == "regenerate" and start["rows_total"] == ROWS


def test_kill_9_half_way_then_resume_equals_an_uninterrupted_run(workdir, data, reference):
    path, _ = data
    out, events = workdir / "killed", workdir / "killed.jsonl"
    # each decoding step slowed (deterministic): the kill lands with rows left whatever the machine
    proc = start_regenerate(path, out, events=events, HSMON_HF_FORWARD_DELAY_S="0.05")
    try:
        wait_for_event(events, lambda e: e["kind"] == "rows" and e["rows_done"] >= 3, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    before = [r for r in manifest(out) if r["type"] == "row"]
    assert 3 <= len(before) < ROWS and not any(r["type"] == "done" for r in manifest(out))
    again = run_regenerate(path, out, events=events)
    assert again.returncode == 0, again.stderr
    assert "committed by an earlier run" in again.stderr
    assert (out / regen_layout.DATA_NAME).read_bytes() == (reference[0] / regen_layout.DATA_NAME).read_bytes()
    committed = [r["row"] for r in manifest(out) if r["type"] in ("row", "reject")]
    assert committed == sorted(set(committed)) and len(committed) == ROWS + len(BAD_ROWS)  # each once


def test_one_writer_per_output_and_a_resume_with_other_settings_is_refused(workdir, data):
    path, _ = data
    out, events = workdir / "locked", workdir / "locked.jsonl"
    # slowed so that its rows outlast the second command's start on any machine (0.2 s a step: an
    # answer takes 5 s, the rows after the first a minute)
    first = start_regenerate(path, out, events=events, HSMON_HF_FORWARD_DELAY_S="0.2")
    try:
        wait_for_event(events, lambda e: e["kind"] == "rows", first)
        second = run_regenerate(path, out)
        assert second.returncode == 2
        line = second.stderr.strip().splitlines()[-1]
        assert f"is being written by PID {first.pid}" in line and "give another --out" in line
        first.send_signal(signal.SIGTERM)  # stopped on request: recorded, the same command resumes
        assert first.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if first.poll() is None:
            first.kill()
    stopped = events_of(events)[-1]
    assert stopped["kind"] == "stopped" and "hsmon regenerate" in stopped["resume"]
    assert manifest(out)[-1]["type"] == "stopped"
    other = run_regenerate(path, out, "--temperature", "0.7")
    assert other.returncode == 2
    assert "started with different settings (sampling" in other.stderr and "use a new --out" in other.stderr


def test_truncated_answers_are_rejects_when_asked(workdir):
    rows = chat_rows(2, start=20)
    path = write_rows(workdir / "cut.jsonl", rows)
    out = workdir / "cut"
    proc = run_regenerate(path, out, "--truncated", "reject", "--max-new-tokens", "4")
    assert proc.returncode == 0, proc.stderr
    rejects = list(layout.iter_jsonl(out / "rejects.jsonl"))
    assert [r["class"] for r in rejects] == ["truncated", "truncated"]
    assert "answer cut at --max-new-tokens 4" in rejects[0]["reason"]
    assert (out / regen_layout.DATA_NAME).read_text() == ""


def test_a_terminal_shows_a_progress_line_not_json(workdir, data):
    """On a terminal the events go to OUT/events.jsonl (said once) and a progress line is redrawn in
    place, as `hsmon extract` does."""
    import pty

    path, _ = data
    out = workdir / "tty"
    pid, fd = pty.fork()
    if pid == 0:  # the child: the command on the terminal
        from regen_helpers import env

        cmd = regen_cmd(path, out, "--heartbeat", "0.2")
        os.execvpe(cmd[0], cmd, env(HSMON_HF_FORWARD_DELAY_S="0.01"))
    chunks = []
    with contextlib.suppress(OSError):
        while data := os.read(fd, 4096):
            chunks.append(data)
    _, status = os.waitpid(pid, 0)
    text = b"".join(chunks).decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, text
    assert '{"v":' not in text  # no event on the terminal
    assert f"events -> {out / 'events.jsonl'}" in text
    line = [part for part in text.split("\r") if "rows" in part and "tok/s" in part]
    assert line and "eta" in line[-1], text
    assert events_of(out / "events.jsonl")[-1]["kind"] == "done"


def test_a_full_disk_pauses_the_run_until_room_is_back(workdir, data, reference, small_disk):  # noqa: F811
    path, _ = data
    out, events = small_disk / "out", workdir / "disk.jsonl"
    ballast = small_disk / "ballast"
    ballast.write_bytes(b"\0" * (4 * 1024 * 1024 - 1024 * 1024 - 40 * 1024))  # under the reserve + margin
    proc = start_regenerate(path, out, events=events)
    try:
        pause = wait_for_event(events, lambda e: e["kind"] == "pause", proc)
        assert pause["reason"] == "disk" and pause["path"] == str(out)
        time.sleep(0.5)
        assert proc.poll() is None  # waiting, not failing
        ballast.unlink()
        resume = wait_for_event(events, lambda e: e["kind"] == "resume", proc)
        assert resume["reason"] == "disk" and resume["paused_seconds"] > 0
        assert proc.wait(timeout=120) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (out / regen_layout.DATA_NAME).read_bytes() == (reference[0] / regen_layout.DATA_NAME).read_bytes()
    assert json.loads((out / regen_layout.MANIFEST_NAME).read_text().splitlines()[-1])["type"] == "done"


def test_extract_takes_the_regeneration_and_status_reads_it_done(workdir, reference):
    """The regeneration's --out is a dataset for `hsmon extract`; `hsmon status --out` alone reads it
    as a done regeneration with its row count; an unfinished one is refused by extract in one line."""
    from extract_helpers import extract_env, load_output

    out = reference[0]
    status = subprocess.run([sys.executable, "-m", "hsmon", "status", "--out", str(out), "--sample", "0.1"],
                            capture_output=True, text=True, timeout=120, env=extract_env())
    assert status.returncode == 0, status.stderr
    head = status.stdout.splitlines()[0]
    assert "[regenerate]: DONE" in head and f"({ROWS} / {ROWS} rows" in head
    assert f"regenerate: {ROWS} rows" in status.stdout and "mean answer" in status.stdout
    hs = workdir / "hidden-states"
    extract = subprocess.run([sys.executable, "-m", "hsmon", "extract", str(out), "--out", str(hs),
                              "--min-free", "1M", "--threads", "1"], capture_output=True, text=True,
                             timeout=300, env=extract_env())
    assert extract.returncode == 0, extract.stderr
    rows = load_output(hs)
    assert len(rows) == ROWS and all(int(r["loss_mask"].sum()) > 0 for r in rows.values())
    unfinished = workdir / "unfinished"  # as a kill -9 leaves it: the manifest's last records missing
    unfinished.mkdir()
    records = (out / regen_layout.MANIFEST_NAME).read_text().splitlines(keepends=True)
    (unfinished / regen_layout.MANIFEST_NAME).write_text("".join(records[:-3]))
    refused = subprocess.run([sys.executable, "-m", "hsmon", "extract", str(unfinished), "--out",
                              str(workdir / "hs-2"), "--dry-run"],
                             capture_output=True, text=True, timeout=120, env=extract_env())
    assert refused.returncode == 2
    assert "a regeneration not finished" in refused.stderr
    assert "run the same hsmon regenerate again" in refused.stderr


def test_rows_finished_out_of_order_are_committed_in_order_each_once(tmp_path):
    """The writer alone, on real files: rows handed over out of order (as concurrent answers finish)
    land in source order; a stop with a gap commits the rows before it only, and the next run goes on
    from there."""
    import threading

    from extractor.regenerate.writer import OrderedWriter, Refused, Regenerated, RegenProgress
    from hsmon.contracts import events as ev
    from hsmon.contracts.regen_layout import RegenTotals, read_totals

    def writer(start: int) -> OrderedWriter:
        progress = RegenProgress(read_totals(tmp_path), rows_total=6, prior_tokens_per_row=1.0)
        w = OrderedWriter(tmp_path, start, progress, ev.EventWriter("t", path=tmp_path / "e.jsonl"),
                          threading.Event(), 0, 0.1)
        w.start()
        return w

    def row(i: int) -> Regenerated:
        return Regenerated(i, i + 1, {"id": i, "conversations": []}, [{"finish": "stop", "tokens": i,
                                                                          "source_tokens": 1}])

    first = writer(0)
    for item in (row(2), row(0), Refused(1, 2, "no user turn: nothing to answer"), row(4)):  # 3 never comes
        first.put(item)
    first.finish()
    lines = (tmp_path / "regenerated.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == [0, 2]
    assert read_totals(tmp_path).last_row == 2  # row 4 waited behind the gap: not committed
    second = writer(3)
    for item in (row(5), row(4), row(3)):
        second.put(item)
    second.finish()
    ids = [json.loads(line)["id"] for line in (tmp_path / "regenerated.jsonl").read_text().splitlines()]
    assert ids == [0, 2, 3, 4, 5]
    totals: RegenTotals = read_totals(tmp_path)
    assert (totals.rows, totals.rejects, totals.last_row) == (5, 1, 5)
    assert totals.end == (tmp_path / "regenerated.jsonl").stat().st_size


def test_sampled_answers_are_reproduced_by_their_seed_and_thinking_can_be_disabled(workdir, data, reference):
    """--temperature above 0: each answer's seed comes from --seed, the row's id and its place, so a
    repeated run draws the same answers, not greedy ones. --reasoning disable reaches the chat template
    as enable_thinking=False (a copy of the embedded target whose template then closes an empty
    thinking block in the generation prompt: its prompts grow by that block against the reference's)."""
    import shutil

    rows = chat_rows(3, start=30)
    path = write_rows(workdir / "sampled.jsonl", rows)
    runs = []
    for name in ("a", "b"):
        proc = run_regenerate(path, workdir / f"sampled-{name}", "--temperature", "0.9", "--seed", "7")
        assert proc.returncode == 0, proc.stderr
        runs.append([answers_of(r) for r in dataset_rows(workdir / f"sampled-{name}")])
    assert runs[0] == runs[1] and runs[0] != transformers_answers(rows)
    model = workdir / "thinking-target"
    shutil.copytree(EMBEDDED, model)
    template = (model / "chat_template.jinja").read_text().replace(
        "{% if add_generation_prompt %}<|assistant|>{% endif %}",
        "{% if add_generation_prompt %}<|assistant|>"
        "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
        "{% endif %}")
    (model / "chat_template.jinja").write_text(template)
    out = workdir / "thinking-disabled"
    proc = run_regenerate(data[0], out, "--model", str(model), "--reasoning", "disable")
    assert proc.returncode == 0, proc.stderr

    def prompts(directory):
        return [t["prompt_tokens"] for r in manifest(directory) if r["type"] == "row" for t in r["turns"]]

    assert all(d > s for s, d in zip(prompts(reference[0]), prompts(out), strict=True))


def test_a_thinking_block_is_saved_apart_or_dropped():
    from extractor.regenerate.turns import split_reasoning

    assert split_reasoning("<think>\nlet me see\n</think>\n\nThe answer.") == ("let me see", "The answer.")
    assert split_reasoning("no block here") == (None, "no block here")
    assert split_reasoning("reasoning without its opening tag</think>yes") == (
        "reasoning without its opening tag", "yes")

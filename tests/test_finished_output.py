"""A finished extraction is never called stalled. The output directory alone (no events
file, no process) tells done from stopped from killed; a quiet directory that nothing accounts for
is a warning, never a page; a watched live process that is frozen still stalls.

Real processes and files: a real `hsmon extract` run to the end, `hsmon status` and `hsmon daemon`
as subprocesses, a real webhook receiver on loopback, the TUI with its trackers in-process, and a
real process frozen with SIGSTOP. (kill -9, SIGTERM and the disk pause line: tests/test_extract_run.py.)
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from daemon_helpers import Daemon, WebhookReceiver, procs, wait_until  # noqa: F401
from extract_helpers import critical_hints, hsmon_status, make_dataset, run_extract, tiny_model  # noqa: F401

from hsmon.contracts import layout
from hsmon.contracts.manifest_reader import read_manifest

pytestmark = pytest.mark.slow

ROWS = 40
TWENTY_TWO_MINUTES = 22 * 60


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_model):  # noqa: F811
    """A real `hsmon extract` run to the end, with no events file kept (stdout discarded)."""
    base = tmp_path_factory.mktemp("finished")
    data = make_dataset(base / "data.jsonl", rows=ROWS, seed=13, min_lines=1, max_lines=3)
    out = base / "out"
    proc = run_extract(data, out, tiny_model, "--chunk-size", "16")
    assert proc.returncode == 0, proc.stderr
    return out


def test_status_of_a_finished_output_dir_is_done_with_totals(finished):
    manifest = read_manifest(finished)
    (done,) = [r for r in layout.iter_jsonl(finished / layout.MANIFEST_NAME) if r.get("type") == "done"]
    (run,) = [r for r in layout.iter_jsonl(finished / layout.MANIFEST_NAME) if r.get("type") == "run"]
    assert (run["rows_total"], run["tokens_total"], run["chunks_total"]) == (ROWS, manifest.tokens, 3)
    assert (done["rows"], done["tokens"], done["bytes"]) == (ROWS, manifest.tokens, manifest.bytes)
    assert done["seconds"] > 0

    rc, job = hsmon_status("--out", str(finished), "--stall-after", "1", "--sample", "0.2")
    assert rc == 0 and job["state"] == "done", job
    prog = job["progress"]
    assert (prog["rows_done"], prog["rows_total"]) == (ROWS, ROWS)
    assert (prog["tokens_done"], prog["tokens_total"]) == (manifest.tokens, manifest.tokens)
    assert (prog["chunks_done"], prog["chunks_total"]) == (3, 3)
    assert prog["elapsed_s"] == done["seconds"]
    assert job["output"]["ending"] == "done" and not critical_hints(job)

    text = subprocess.run(
        [sys.executable, "-m", "hsmon", "status", "--out", str(finished), "--stall-after", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert ": DONE for " in text and f"rows         {ROWS} / {ROWS} (100.0 %)" in text, text
    assert f"tokens       {manifest.tokens} / {manifest.tokens}" in text and "chunks       3 / 3" in text
    assert "took " in text and "critical" not in text


def test_a_run_that_finished_ten_minutes_ago_reads_done_for_ten_minutes_as_an_extraction(finished, tmp_path):
    """The state's age is the job's own record (the manifest's done time), not the reader's start;
    an output directory with hsmon's manifest is an extraction, not `[external]`."""
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    manifest = out / layout.MANIFEST_NAME
    records = [json.loads(line) for line in manifest.read_text().splitlines()]
    ended = time.time() - 600  # the run finished 10 minutes ago
    for record in records:
        if record.get("type") == "done":
            record["ts"] = ended
    manifest.write_text("".join(json.dumps(r) + "\n" for r in records))

    rc, job = hsmon_status("--out", str(out), "--stall-after", "1")
    assert rc == 0 and job["state"] == "done" and job["kind"] == "extract", job
    assert job["state_since_ts"] == pytest.approx(ended, abs=0.01)
    text = subprocess.run([sys.executable, "-m", "hsmon", "status", "--out", str(out)],
                          capture_output=True, text=True, timeout=60).stdout
    first = text.splitlines()[0]
    assert first.startswith("job [extract]: DONE for 10m") and "finished 10m ago" in first, text


def test_daemon_on_a_finished_output_stays_done_and_pages_nobody(procs, finished, tmp_path):  # noqa: F811
    hook = WebhookReceiver()
    try:
        daemon = Daemon(
            procs,
            tmp_path,
            [
                "--job",
                "ext",
                "--out",
                str(finished),
                "--stall-after",
                "2",
                "--scan-interval",
                "0.5",
                "--notify-webhook",
                hook.url,
            ],
        )
        seen = []
        deadline = time.monotonic() + 7  # several scans, well past --stall-after
        while time.monotonic() < deadline:
            seen.append(daemon.job()["state"])
            time.sleep(0.3)
        assert set(seen) == {"done"}, seen
        job = daemon.job()
        assert job["progress"]["rows_done"] == job["progress"]["rows_total"] == ROWS
        daemon.stop()
        states = [b["state"] for b in hook.bodies]
        assert states in ([], ["done"]), hook.bodies  # at most "it is done", never a stall
    finally:
        hook.close()


@pytest.mark.asyncio
async def test_tui_on_a_finished_output_shows_done_and_totals(finished):
    from test_tui_pilot import screen_text, wait_for

    from hsmon.core.config import JobConfig
    from hsmon.tui.app import HsmonApp
    from hsmon.tui.sources import InProcessSource

    job = JobConfig(name="extract", out_dir=str(finished), stall_after=1)
    app = HsmonApp([InProcessSource([job], interval=0.3)])
    async with app.run_test(size=(160, 50)) as pilot:
        await wait_for(pilot, lambda: "DONE" in (t := screen_text(app)) and f"{ROWS} / {ROWS}" in t, 20)
        await pilot.pause(2.0)  # past --stall-after: still done
        text = screen_text(app)
        assert "DONE" in text and "3 / 3" in text and "STALLED" not in text and "QUIET" not in text


def test_plain_specforge_dir_quiet_without_process_and_stalled_with_a_frozen_one(finished, tmp_path):
    plain = tmp_path / "specforge"
    plain.mkdir()
    for chunk in finished.glob("rows_*"):
        shutil.copytree(chunk, plain / chunk.name)  # SpecForge layout: rows only, no hsmon manifest
    old = time.time() - TWENTY_TWO_MINUTES  # finished 22 minutes ago, as in the issue
    for path in [plain, *plain.rglob("*")]:
        os.utime(path, (old, old))

    rc, job = hsmon_status("--out", str(plain), "--stall-after", "300", "--sample", "0.2")
    assert job["output"]["layout"] == "specforge" and job["output"]["rows"] == ROWS
    assert rc == 0 and job["state"] == "quiet", job
    (hint,) = [h for h in job["hints"] if h["id"] == "quiet"]
    assert hint["severity"] == "warning" and hint["message"] == (
        "no change for 22m; no process watched, so finished and stalled look alike: "
        "add --pid, --match or --events"
    )
    assert not critical_hints(job)

    frozen = subprocess.Popen(["sleep", "300"])
    try:
        os.kill(frozen.pid, signal.SIGSTOP)
        rc, job = hsmon_status(
            "--out", str(plain), "--pid", str(frozen.pid), "--stall-after", "300", "--sample", "0.5"
        )
        assert rc == 1 and job["state"] == "stalled", job
        assert {"stalled", "process-stopped"} <= {h["id"] for h in job["hints"]}
    finally:
        frozen.kill()
        frozen.wait()

"""The status document's compatibility promise (docs/status-api.md, "Compatibility"): a document
recorded from the first release with the promise (tests/fixtures/status_document.v1.json, never
re-recorded) reads in this release's `hsmon status --url` and TUI; a field required now was already
required in v1; unknown fields are ignored; a future major version is refused in one line."""

from __future__ import annotations

import asyncio
import copy
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from hsmon import status_doc as sd
from hsmon.status_doc.document import FutureVersionError

FIXTURES = Path(__file__).parent / "fixtures"
V1 = FIXTURES / "status_document.v1.json"


def _required(schema: dict) -> dict[str, set[str]]:
    return {name: set(d.get("required", [])) for name, d in schema["$defs"].items()}


def test_every_field_required_now_was_required_in_v1() -> None:
    """A field added after v1 must be optional with a default, or v1 documents stop reading."""
    v1 = _required(json.loads((FIXTURES / "status_schema.v1.json").read_text()))
    now = _required(sd.schema())
    added = {name: sorted(req - v1[name]) for name, req in now.items() if name in v1 and req - v1[name]}
    assert not added, f"required fields added after v1 (give them defaults): {added}"


def test_unknown_fields_at_every_level_are_ignored() -> None:
    doc = json.loads(V1.read_text())
    newer = copy.deepcopy(doc)
    newer["fleet"] = {"hosts": 3}
    newer["daemon"]["spool"] = "x"
    newer["jobs"][0]["replicas"] = {"state": "following", "rows_waiting": 12}  # a later field
    newer["jobs"][0]["processes"][0]["numa_node"] = 1
    assert sd.to_builtins(sd.decode(json.dumps(newer))) == sd.to_builtins(sd.decode(json.dumps(doc)))


def test_a_future_major_version_is_refused_in_one_line() -> None:
    future = {"v": sd.STATUS_VERSION + 1, "jobs": "another shape"}
    for read in (lambda: sd.decode(json.dumps(future)), lambda: sd.from_builtins(future)):
        with pytest.raises(FutureVersionError) as exc:
            read()
        assert str(exc.value) == ("status document v2 is newer than this hsmon reads (v1 and older): "
                                  "upgrade hsmon where you read it")  # fmt: skip


@contextmanager
def _serving(body: bytes) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _status(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hsmon", "status", "--url", url], capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def test_hsmon_status_reads_the_v1_document_and_refuses_a_future_one() -> None:
    with _serving(V1.read_bytes()) as url:
        run = _status(url)
    assert run.returncode == 0, run.stderr
    assert "extract [extract]: RUNNING" in run.stdout and "step 21 / 10.0k, epoch 0" in run.stdout
    future = json.loads(V1.read_text()) | {"v": 2}
    with _serving(json.dumps(future).encode()) as url:
        run = _status(url)
    assert run.returncode != 0
    assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "status document v2 is newer than this hsmon reads" in run.stderr


def test_the_tui_reads_the_v1_document_and_refuses_a_future_one(tmp_path) -> None:
    from textual.widgets import TabbedContent

    from hsmon.tui.app import HsmonApp
    from hsmon.tui.sources import FixedSource

    async def shown() -> str:
        app = HsmonApp([FixedSource.from_file(str(V1))])
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(200):
                if app.documents and app.query(TabbedContent).first().display:
                    break
                await pilot.pause(0.05)
            await pilot.pause(0.3)
            tabs = app.screen.query_one(TabbedContent)
            return " ".join(str(tab.label) for tab in tabs.query("Tab"))

    assert asyncio.run(shown()) == "extract train written"
    future = tmp_path / "v2.json"
    future.write_text(json.dumps(json.loads(V1.read_text()) | {"v": 2}))
    with pytest.raises(ValueError, match=r"^status document v2 is newer than this hsmon reads"):
        FixedSource.from_file(str(future))


def test_a_state_added_after_v1_reads_as_itself_and_an_ended_job_shows_no_eta(tmp_path) -> None:
    """`stopped` came after v1: a document carrying it reads in `hsmon status` and the TUI as
    STOPPED (never as done, never refused), and the stale ETA a writer left in it is not shown."""
    from hsmon.tui.app import HsmonApp
    from hsmon.tui.sources import FixedSource
    from hsmon.tui.widgets.job_header import JobHeader

    doc = json.loads(V1.read_text())
    doc["jobs"][0].update(state="stopped", reason="the job stopped on request (SIGINT) at 193 / 400 rows")
    assert doc["jobs"][0]["progress"]["eta_s"] > 0  # a stale estimate, as an older daemon may leave
    with _serving(json.dumps(doc).encode()) as url:
        run = _status(url)
    assert run.returncode == 0, run.stderr
    line = next(x for x in run.stdout.splitlines() if x.startswith("extract [extract]:"))
    assert "STOPPED" in line and "DONE" not in line and "stopped on request (SIGINT)" in line
    rate = next(x for x in run.stdout.splitlines() if x.strip().startswith("rate"))
    assert "ETA" not in rate, rate
    path = tmp_path / "stopped.json"
    path.write_text(json.dumps(doc))

    async def header() -> str:
        app = HsmonApp([FixedSource.from_file(str(path))])
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(200):
                if app.documents and "STOPPED" in str(app.screen.query(JobHeader).first().render()):
                    break
                await pilot.pause(0.05)
            return str(app.screen.query(JobHeader).first().render())

    shown = asyncio.run(header())
    assert shown.startswith(" STOPPED ") and "ETA" not in shown and "  ended " in shown, shown

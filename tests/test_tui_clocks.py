"""Nothing repaints while only clocks move: durations at the resolution of their size, and a
source that sends a document only when more than its clocks changed or the next minute has come."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from textual.message import Message
from tui_complete import complete, typed, typed_job
from tui_documents import documents
from tui_status_server import StatusServer

from hsmon.contracts.units import format_duration
from hsmon.status.client import KeptGet
from hsmon.status_doc.numbers import coarse_clocks, fmt_clock
from hsmon.tui import sources
from hsmon.tui.clocks import has_short_clocks, next_minute, quiet_signature
from hsmon.tui.messages import StatusUpdate
from hsmon.tui.sources import HttpStatusSource, StatusSource
from hsmon.tui.view import HISTORY_POINTS, JobHistory, job_elapsed_eta


def test_durations_change_once_a_minute_past_a_minute() -> None:
    assert [fmt_clock(s) for s in (0, 59.9, 60, 119, 245, 3599, 3600, 7500)] == [
        "0s", "59s", "1m", "1m", "4m", "59m", "1h00m", "2h05m"]
    assert fmt_clock(None) == "-"
    # a projection at a trickle's rate: days, and past a year no figure at all
    assert [fmt_clock(s) for s in (47 * 3600, 999_999, 1_061_736_000)] == [
        "47h00m", "11d13h", "over a year"]
    assert format_duration(999_999) == "11d13h" and format_duration(400 * 86_400) == "over a year"
    assert coarse_clocks("progress events 68s ago") == "progress events 1m ago"
    assert coarse_clocks("progress events 5s ago, 2 servers") == "progress events 5s ago, 2 servers"
    assert coarse_clocks("moved 7500 s ago") == "moved 2h05m ago"


def test_a_finished_job_keeps_its_elapsed_time_to_the_second() -> None:
    running = {"state": "running", "progress": {"elapsed_s": 62.0, "eta_s": 289.0}}
    assert job_elapsed_eta(typed_job(running)) == ("1m", "4m")
    assert job_elapsed_eta(typed_job(running | {"state": "done"})) == ("1m02s", "-")


def frozen(doc: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The same document ``seconds`` later for a job that does nothing: only its clocks moved."""
    later = copy.deepcopy(doc)
    later["generated_ts"] += seconds
    for job in later["jobs"]:
        job["reason"] = re.sub(r"\d+(?=s ago)", lambda m: str(int(m.group(0)) + int(seconds)), job["reason"])
        job["progress"]["elapsed_s"] += seconds
        for proc in job.get("processes") or []:
            proc["uptime_s"] = (proc.get("uptime_s") or 0) + seconds
        for disk in job.get("disk") or []:
            disk["free_bytes"] += 4096  # another process wrote a page: "800.0 GB free" all the same
    return later


def quiet_documents() -> list[dict[str, Any]]:
    """The fixture documents of a job whose last progress event is 70 s old."""
    docs = documents(3)
    for doc in docs:
        for job in doc["jobs"]:
            job["reason"] = "progress events 70s ago"
    return docs


def test_the_signature_ignores_clocks_only() -> None:
    doc = quiet_documents()[0]
    assert quiet_signature(typed(frozen(doc, 1))) == quiet_signature(typed(doc))
    moved = frozen(doc, 1)
    moved["jobs"][0]["progress"]["rows_done"] += 1
    assert quiet_signature(typed(moved)) != quiet_signature(typed(doc))
    state = frozen(doc, 1)
    state["jobs"][0]["state"] = "stalled"
    assert quiet_signature(typed(state)) != quiet_signature(typed(doc))
    soon = copy.deepcopy(doc)
    soon["jobs"][0]["reason"] = "progress events 5s ago"  # below a minute: shown to the second
    assert quiet_signature(typed(frozen(soon, 1))) != quiet_signature(typed(soon))


class Recorder(StatusSource):
    def __init__(self) -> None:
        super().__init__(interval=1.0)
        self.sent: list[Message] = []
        self._post = self.sent.append


def test_a_source_sends_changes_and_the_minute_and_counts_what_it_skipped() -> None:
    doc = quiet_documents()[0]
    source = Recorder()
    source._deliver(typed(doc))
    assert len(source.sent) == 1  # the first document, always
    source.due_ts = next_minute(doc["generated_ts"])
    for seconds in range(1, 5):
        source._deliver(typed(frozen(doc, seconds)))
    assert len(source.sent) == 1  # clocks only: nothing sent, nothing repainted
    moved = frozen(doc, 5)
    moved["jobs"][0]["progress"]["rows_done"] += 7
    source._deliver(typed(moved))
    assert len(source.sent) == 2
    update = source.sent[-1]
    assert isinstance(update, StatusUpdate) and update.skipped == 4
    source._deliver(typed(frozen(moved, source.due_ts - moved["generated_ts"])))  # the next minute
    assert len(source.sent) == 3
    source.due_ts = next_minute(source.due_ts)
    source.poll_now()  # the user's `r`: sent whatever it is
    source._deliver(typed(frozen(moved, 61)))
    assert len(source.sent) == 4


def test_skipped_documents_still_count_in_the_sparklines() -> None:
    """Documents skipped while nothing changed are the last reading's time in the charts (a chart
    is along the documents' time), and a history settles once every reading is the same."""
    doc = documents(3)
    history = JobHistory()
    history.add(typed(doc[0]).jobs[0], doc[0]["generated_ts"])
    history.add(typed(doc[1]).jobs[0], doc[0]["generated_ts"] + 4, skipped=3)
    first = doc[0]["jobs"][0]["progress"]["rows_per_s"]
    values = list(history.rows_per_s)  # the 4 s between read as the first reading, then the new one
    assert set(values[:-1]) == {first} and values[-1] == doc[1]["jobs"][0]["progress"]["rows_per_s"]
    assert history.rows_per_s.span == (doc[0]["generated_ts"], doc[0]["generated_ts"] + 4)
    assert not history.settled()
    history.add(typed(doc[2]).jobs[0], doc[0]["generated_ts"] + 4 + HISTORY_POINTS, skipped=HISTORY_POINTS)
    assert not history.settled()  # the newest reading differs
    steady = JobHistory()
    for ts in (doc[2]["generated_ts"], doc[2]["generated_ts"] + 60):
        steady.add(typed(doc[2]).jobs[0], ts, skipped=HISTORY_POINTS)
    assert steady.settled()


def test_short_clocks_are_the_ones_below_a_minute() -> None:
    job = documents(1)[0]["jobs"][0]
    now = documents(1)[0]["generated_ts"]
    job["reason"] = "progress events 70s ago"
    for proc in job["processes"]:
        proc["uptime_s"] = 600.0
    job["dump"]["oldest_age_s"] = 75.0
    assert not has_short_clocks(typed_job(job), now - 61, now)
    assert has_short_clocks(typed_job(job), now - 59, now)  # an event 59 s old is shown to the second
    assert has_short_clocks(typed_job(dict(job, reason="progress events 7s ago")), now - 61, now)
    young = copy.deepcopy(job)
    young["processes"][0]["uptime_s"] = 12.0
    assert has_short_clocks(typed_job(young), now - 61, now)


def test_the_kept_socket_reads_the_status_and_leaves_errors_to_http_client() -> None:
    docs = quiet_documents()
    server = StatusServer(docs)  # HTTP/1.0: it closes each connection, so each read reconnects
    try:
        kept = KeptGet("127.0.0.1", server.port, "/api/v1/status", 3.0)
        assert json.loads(kept.get() or b"") == complete(docs[0])
        assert json.loads(kept.get() or b"") == complete(docs[1])
        assert KeptGet("127.0.0.1", server.port, "/nowhere", 3.0).get() is None  # a 404: not ours to word
        source = HttpStatusSource(f"http://127.0.0.1:{server.port}")
        assert source.fetch() == typed(docs[2])
    finally:
        server.close()


def test_a_daemon_document_whose_clocks_alone_moved_is_not_even_parsed(monkeypatch) -> None:
    docs = quiet_documents()
    later = frozen(docs[0], 1)  # the clocks, the reason's 70s and a page of free bytes moved
    moved = frozen(docs[0], 2)
    moved["jobs"][0]["progress"]["rows_done"] += 3
    server = StatusServer([docs[0], later, moved])
    parsed = []
    decode = sources.decode
    monkeypatch.setattr(sources, "decode", lambda body: parsed.append(1) or decode(body))
    try:
        source = HttpStatusSource(f"http://127.0.0.1:{server.port}")
        sent: list[Message] = []
        source._post = sent.append
        document = source.fetch()
        assert document is not None and source._deliver(document) and len(parsed) == 1
        source.due_ts = next_minute(docs[0]["generated_ts"])
        assert source.fetch() is None and source._skipped == 1 and len(parsed) == 1
        document = source.fetch()
        assert document is not None and source._deliver(document)
        assert len(sent) == 2 and sent[-1].skipped == 1 and len(parsed) == 2
    finally:
        server.close()

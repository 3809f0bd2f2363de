"""A tracker that raises is counted, logged once per kind, and leaves every other tracker and job
running (hsmon/core/tracker_errors.py). The exception is injected: a bug cannot be made real on demand."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from daemon_helpers import procs  # noqa: F401

from hsmon.contracts import events as ev
from hsmon.core.config import JobConfig
from hsmon.core.monitor import Monitor
from hsmon.core.trackers.output_dir import OutputDirTracker
from hsmon.daemon.notify import Notifier
from hsmon.metrics.exporter import MetricsEndpoint


def test_a_failing_output_tracker_leaves_its_events_and_the_other_job_watched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    events = {name: tmp_path / f"{name}.jsonl" for name in ("broken", "fine")}
    for name, path in events.items():
        with ev.EventWriter(name, path) as w:
            w.emit(ev.START, rows_total=10)
            w.emit(ev.ROWS, rows=3, tokens=30, last_row=2, rows_done=3, rows_total=10, tokens_done=30,
                   tokens_total=100, bytes_done=300)
    (tmp_path / "out").mkdir()
    jobs = [JobConfig(name="broken", events=str(events["broken"]), out_dir=str(tmp_path / "out")),
            JobConfig(name="fine", events=str(events["fine"]))]
    monitor = Monitor(jobs, use_watchdog=False)

    def boom(self: OutputDirTracker, background: bool = False) -> None:
        raise RuntimeError("injected: the output tracker's bug")

    monkeypatch.setattr(OutputDirTracker, "scan", boom)
    with caplog.at_level(logging.ERROR, logger="hsmon.core.trackers"):
        for _ in range(3):
            monitor.tick(force_scan=True)
    docs = {job["job"]: job for job in monitor.status_document()["jobs"]}
    assert docs["broken"]["progress"]["rows_done"] == 3  # its events tracker ran on
    assert docs["fine"]["progress"]["rows_done"] == 3 and docs["fine"]["state"] == "running"
    assert monitor.status_document()["daemon"]["tracker_errors"] == {"output_dir": 3}
    logged = [r for r in caplog.records if "tracker output_dir failed" in r.getMessage()]
    assert len(logged) == 1 and "job broken" in logged[0].getMessage()
    text = MetricsEndpoint(monitor, Notifier("http://127.0.0.1:9/")).render().decode()
    assert 'hsmon_tracker_errors_total{tracker="output_dir"} 3.0' in text


def test_a_job_whose_update_fails_does_not_stop_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = tmp_path / "fine.jsonl"
    with ev.EventWriter("fine", events) as w:
        w.emit(ev.START, rows_total=10)
    monitor = Monitor([JobConfig(name="first", events=str(tmp_path / "none.jsonl")),
                       JobConfig(name="fine", events=str(events))], use_watchdog=False)
    first = monitor._jobs["first"]

    def fail(*args: object, **kwargs: object) -> None:
        raise KeyError("injected")

    monkeypatch.setattr(first, "update", fail)
    monitor.tick(force_scan=True)
    docs = {job["job"]: job for job in monitor.status_document()["jobs"]}
    assert docs["fine"]["progress"]["rows_total"] == 10
    assert monitor.status_document()["daemon"]["tracker_errors"] == {"job": 1}


def test_a_tracker_registered_in_the_list_that_raises_leaves_the_others_updating(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A tracker added to JOB_TRACKERS (hsmon/core/job_trackers.py) whose poll and section raise for real
    (a missing file read; a section fed a bad value): counted, logged once per kind, and the job's
    other sections and the other job still move from tick to tick."""
    import msgspec

    from hsmon.core import job_trackers
    from hsmon.status_doc import DumpSection

    class Broken(job_trackers.JobTracker):
        name = "broken_tracker"

        def poll(self, now: float) -> None:
            (tmp_path / "no-such-file").read_text()  # FileNotFoundError

        def section(self, now: float) -> DumpSection:
            return msgspec.convert({"files": "many"}, DumpSection)  # ValidationError

    def broken_for_one_job(rt: object) -> object:
        return Broken(rt) if rt.cfg.name == "broken" else None  # type: ignore[attr-defined]

    monkeypatch.setattr(job_trackers, "JOB_TRACKERS", [*job_trackers.JOB_TRACKERS, broken_for_one_job])
    events = {name: tmp_path / f"{name}.jsonl" for name in ("broken", "fine")}
    writers = {name: ev.EventWriter(name, path) for name, path in events.items()}
    dump = tmp_path / "dump"
    dump.mkdir()
    monitor = Monitor([JobConfig(name="broken", events=str(events["broken"]), dump_dir=str(dump)),
                       JobConfig(name="fine", events=str(events["fine"]))], use_watchdog=False)
    try:
        for w in writers.values():
            w.emit(ev.START, rows_total=10)
        with caplog.at_level(logging.ERROR, logger="hsmon.core.trackers"):
            for tick in range(1, 4):
                for w in writers.values():
                    w.emit(ev.ROWS, rows=1, tokens=10, last_row=tick - 1, rows_done=tick, rows_total=10)
                (dump / f"f{tick}.pt").write_bytes(b"x" * 10)
                monitor.tick(force_scan=True)
                docs = {job["job"]: job for job in monitor.status_document()["jobs"]}
                assert docs["broken"]["progress"]["rows_done"] == tick  # its progress tracker ran on
                assert docs["broken"]["dump"]["files"] == tick  # and its dump tracker
                assert docs["fine"]["progress"]["rows_done"] == tick and docs["fine"]["state"] == "running"
    finally:
        for w in writers.values():
            w.close()
    assert monitor.status_document()["daemon"]["tracker_errors"] == {"broken_tracker": 6}
    logged = [r.getMessage() for r in caplog.records if "tracker broken_tracker failed" in r.getMessage()]
    assert len(logged) == 2, logged  # once per kind
    assert any("FileNotFoundError" in m for m in logged) and any("ValidationError" in m for m in logged)


def test_every_registered_tracker_answers_the_one_interface(tmp_path: Path) -> None:
    """The job's trackers (made from JOB_TRACKERS) and the machine's GPU tracker are all Trackers,
    each with a name of its own; each tracker's metrics hook is listed for the exporter."""
    from hsmon.core import job_trackers
    from hsmon.core.trackers.base import Tracker

    (tmp_path / "out").mkdir()
    (tmp_path / "dump").mkdir()
    monitor = Monitor([JobConfig(name="all", events=str(tmp_path / "e.jsonl"), out_dir=str(tmp_path / "out"),
                                 dump_dir=str(tmp_path / "dump"), pid=1)], use_watchdog=False)
    trackers = [*monitor._jobs["all"].trackers, monitor.gpu]
    assert all(isinstance(t, Tracker) for t in trackers)
    names = ["progress", "server", "processes", "dump_dir", "output_dir", "online", "regenerate",
             "disk", "gpu"]
    assert [t.name for t in trackers] == names
    assert len(job_trackers.TRACKER_METRICS) == len(set(job_trackers.TRACKER_METRICS)) == 8


def test_a_process_tracker_failing_every_tick_makes_the_job_unknown_not_stale_alive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, procs  # noqa: F811
) -> None:
    """Blind is a state (hsmon/core/state_blind.py): after BLIND_AFTER failed polls in a row the job
    reads `unknown` with the tracker, since when and the error, a warning hint, the `blind` list in
    the document, the metric and `hsmon status`'s stale line; one good poll clears it."""
    import subprocess
    import sys

    from hsmon.core.trackers.processes import ProcessTracker
    from hsmon.status.cli import render
    from hsmon.status_doc import decode, encode
    from hsmon.tui.view import process_rows, stale_sections

    events = tmp_path / "e.jsonl"
    writer = ev.EventWriter("job", events)
    writer.emit(ev.START, rows_total=100)
    sleeper = procs.start([sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.DEVNULL)
    monitor = Monitor([JobConfig(name="job", events=str(events), pid=sleeper.pid)], use_watchdog=False)
    real_poll = ProcessTracker.poll

    def denied(self: ProcessTracker) -> dict:
        raise PermissionError(13, "Permission denied", f"/proc/{sleeper.pid}/stat")

    def tick(row: int) -> dict:
        writer.emit(ev.ROWS, rows=1, tokens=10, last_row=row, rows_done=row + 1, rows_total=100)
        monitor.tick(force_scan=True)
        return monitor.status_document()["jobs"][0]

    try:
        first = tick(0)
        assert first["state"] == "running"
        # the process's status at the last good poll: running while the interpreter starts, then
        # sleeping (a fast machine gets there before the first tick)
        last_seen = first["processes"][0]["status"]
        assert last_seen in ("running", "sleeping")
        monkeypatch.setattr(ProcessTracker, "poll", denied)
        assert tick(1)["state"] == "running" and tick(2)["state"] == "running"  # a blip is not blindness
        job = tick(3)
        assert job["state"] == "unknown", job["reason"]
        assert job["reason"].startswith("the processes tracker is blind since ")
        assert "(3 failures in a row: PermissionError: [Errno 13] Permission denied" in job["reason"]
        assert job["reason"].endswith("; last verdict before: running, progress events 0s ago")
        assert [h["id"] for h in job["hints"] if h["severity"] == "warning"] == ["tracker-blind"]
        (blind,) = job["blind"]
        assert blind["tracker"] == "processes" and blind["failures"] == 3 and blind["stale"] == ["processes"]
        text = MetricsEndpoint(monitor, Notifier("http://127.0.0.1:9/")).render().decode()
        family = 'hsmon_tracker_blind_since_timestamp_seconds{job="job",tracker="processes"}'
        (value,) = [line.split()[-1] for line in text.splitlines() if line.startswith(family)]
        assert float(value) == blind["since_ts"]
        doc = decode(encode(monitor.status()))
        shown = render(doc)
        cells = process_rows(doc.jobs[0].processes, "processes" in stale_sections(doc.jobs[0]))[0]
        assert cells[2] == f"stale: {last_seen}"  # the TUI's processes table: never a plain last-known state
        assert "job [external]: UNKNOWN" in shown
        assert "~ stale: processes (the processes tracker is blind for 0s: PermissionError" in shown
        monkeypatch.setattr(ProcessTracker, "poll", real_poll)
        job = tick(4)
        assert job["state"] == "running" and "blind" not in job
    finally:
        writer.close()


def _running_job(tmp_path: Path) -> tuple[ev.EventWriter, JobConfig]:
    events = tmp_path / "e.jsonl"
    writer = ev.EventWriter("job", events)
    writer.emit(ev.START, rows_total=100)
    writer.emit(ev.ROWS, rows=1, tokens=10, last_row=0, rows_done=1, rows_total=100)
    return writer, JobConfig(name="job", events=str(events))


def test_a_tracker_call_that_never_returns_makes_every_figure_stale_then_clears(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read blocked on a hung mount raises nothing and freezes the one tick thread (every job's
    figures stay as they were). The hang is injected (a hung mount cannot be made here): the events
    tracker's poll waits on an Event. Past ``stale_after`` the job reads `unknown`, naming the call
    the tick is stuck in, with every section marked stale in the document, the metric, `hsmon status`
    and the TUI's process table; when the call returns, the job reads running again."""
    import threading

    from hsmon.core.trackers.progress import ProgressTracker
    from hsmon.status.cli import render
    from hsmon.status_doc import decode, encode
    from hsmon.tui.view import stale_sections

    writer, cfg = _running_job(tmp_path)
    real_poll, hung, entered = ProgressTracker.poll, threading.Event(), threading.Event()

    def poll(self: ProgressTracker, *args: object, **kwargs: object) -> object:
        if not hung.is_set():
            entered.set()
            hung.wait(30)  # until the test lets it go ("the mount comes back")
        return real_poll(self, *args, **kwargs)

    hung.set()
    monitor = Monitor([cfg], use_watchdog=False, tick_interval=0.1, stale_after=1.5)
    monitor.start()
    endpoint = MetricsEndpoint(monitor, Notifier("http://127.0.0.1:9/"))
    try:
        assert monitor.status().jobs[0].state == "running"
        assert b"hsmon_tracker_blind_since" not in endpoint.render().split(b"# HELP hsmon_tick")[0].split(
            b"# TYPE hsmon_tracker_blind_since_timestamp_seconds gauge")[1]  # scrapes come: the tick renders
        deadline = time.monotonic() + 5
        while endpoint.prerenders_total == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert endpoint.prerenders_total > 0
        hung.clear()
        monkeypatch.setattr(ProgressTracker, "poll", poll)
        assert entered.wait(10)
        job = monitor.status().jobs[0]
        assert job.state == "running"  # within stale_after the last figures stand
        deadline = time.monotonic() + 10
        while job.state != "unknown" and time.monotonic() < deadline:
            time.sleep(0.1)
            job = monitor.status().jobs[0]
        assert job.state == "unknown", job.reason
        assert job.reason.startswith("no fresh figures for "), job.reason
        assert "the monitor's tick is stuck in the progress tracker's poll since " in job.reason
        assert "; last verdict before: running, " in job.reason, job.reason
        assert [h.id for h in job.hints if h.severity == "warning"] == ["tracker-blind"]
        (blind,) = job.blind
        assert blind.tracker == "progress" and {"processes", "progress", "output"} <= set(blind.stale)
        assert {"processes", "progress"} <= stale_sections(job)
        # the tick count stands still while the tick is stuck: once the last rendered text is older
        # than TEXT_MAX_AGE_S (5 s), the scrape renders the stale state itself
        family = 'hsmon_tracker_blind_since_timestamp_seconds{job="job",tracker="progress"}'
        deadline = time.monotonic() + 10
        while family not in (text := endpoint.render().decode()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert family in text and 'hsmon_job_state{job="job",state="unknown"} 1.0' in text
        shown = render(decode(encode(monitor.status())))
        assert "job [external]: UNKNOWN" in shown and "~ stale: processes, progress" in shown, shown
        hung.set()  # the call returns: the next tick measures again
        deadline = time.monotonic() + 10
        while job.state != "running" and time.monotonic() < deadline:
            time.sleep(0.1)
            job = monitor.status().jobs[0]
        assert job.state == "running" and not job.blind, job.reason
    finally:
        hung.set()
        monitor.stop()
        writer.close()


def test_a_slow_tick_within_stale_after_never_reads_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slow but alive: every tick takes 0.6 s (made deterministic: the events tracker's poll sleeps),
    longer than the tick interval, shorter than ``stale_after``: read every 50 ms for 4 s, the job
    reads running every time and no section is marked stale."""
    from hsmon.core.trackers.progress import ProgressTracker

    writer, cfg = _running_job(tmp_path)
    real_poll = ProgressTracker.poll

    def slow_poll(self: ProgressTracker, *args: object, **kwargs: object) -> object:
        time.sleep(0.6)
        return real_poll(self, *args, **kwargs)

    monkeypatch.setattr(ProgressTracker, "poll", slow_poll)
    monitor = Monitor([cfg], use_watchdog=False, tick_interval=0.1, stale_after=1.5)
    monitor.start()
    try:
        ticks, states = monitor.ticks_total, set()
        end = time.monotonic() + 4
        while time.monotonic() < end:
            job = monitor.status().jobs[0]
            states.add((job.state, bool(job.blind)))
            time.sleep(0.05)
        assert states == {("running", False)}
        assert 2 <= monitor.ticks_total - ticks <= 8  # ticks ran, and slowly (0.6 s each; unslowed: ~40)
    finally:
        monitor.stop()
        writer.close()

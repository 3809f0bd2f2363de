"""How a job ended, decided purely: a process that writes no events read from its log and
its output, a process started by `hsmon run` judged only once hsmon run has recorded its end; the
log-tail classifier, the rotating log and hsmon run's ending, all without threads or clocks."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from hsmon.contracts import events as ev
from hsmon.core import logtail
from hsmon.core.state import decide
from hsmon.core.state_facts import ALERT_STATES, STATES, ProcessFacts, Snapshot
from hsmon.runner.cli import _ending, job_name
from hsmon.runner.rotating_log import RotatingLog

NOW = 10_000.0
TRACEBACK = [
    "packed row 11",
    "Traceback (most recent call last):",
    '  File "extract.py", line 40, in <module>',
    "    main()",
    '  File "extract.py", line 31, in main',
    "    raise ValueError('row 12 has no hidden states')",
    "ValueError: row 12 has no hidden states",
]


def gone(**kw) -> Snapshot:
    """An external process (no start event) watched by --pid, now gone."""
    base = dict(
        now=NOW,
        stall_after=60.0,
        watch_start_ts=NOW - 1000,
        process_watched=True,
        processes=[ProcessFacts("extractor", 42, False, "gone", seen_alive=True)],
        last_work_ts=NOW - 5,
    )
    base.update(kw)
    return Snapshot(**base)


def hint(decision, hint_id):
    return next((h for h in decision.hints if h.id == hint_id), None)


def test_exited_is_a_known_alert_state():
    assert "exited" in STATES and "exited" in ALERT_STATES


def test_traceback_at_the_end_of_the_log_is_dead_with_the_exception_line():
    d = decide(gone(exit_log="/x/extract.log", exit_log_tail=TRACEBACK, rows_done=12, rows_total=12))
    assert d.state == "dead"  # the log wins over a total reached
    assert "ValueError: row 12 has no hidden states" in d.reason
    h = hint(d, "dead")
    assert h.severity == "critical" and "/x/extract.log" in h.message


@pytest.mark.parametrize(
    "line",
    ["Killed", "Segmentation fault (core dumped)", "RuntimeError: CUDA error: an illegal memory access",
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
     "Fatal Python error: Segmentation fault"],
)
def test_failure_lines_at_the_end_are_dead(line):
    d = decide(gone(exit_log="/x/log", exit_log_tail=["packed row 3", line]))
    assert d.state == "dead" and line in d.reason


def test_a_zombie_reads_its_log_too():
    zombie = ProcessFacts("extractor", 42, True, "zombie", seen_alive=True)
    assert decide(gone(processes=[zombie], exit_log="/x/log", exit_log_tail=["Killed"])).state == "dead"


def test_total_reached_and_clean_log_is_done():
    d = decide(gone(exit_log="/x/log", exit_log_tail=["packed row 29"], rows_done=30, rows_total=30))
    assert d.state == "done" and "30 of 30" in d.reason
    assert not [h for h in d.hints if h.severity in ("warning", "critical")]


def test_total_reached_without_a_log_is_done():
    assert decide(gone(rows_done=31, rows_total=30)).state == "done"


def test_clean_exit_without_total_is_exited_a_warning_never_critical():
    d = decide(gone(exit_log="/x/log", exit_log_tail=["packed row 29: 4096 bytes"], rows_done=30))
    assert d.state == "exited"
    h = hint(d, "exited")
    assert h.severity == "warning" and "/x/log" in h.message and "packed row 29" in h.message
    assert "30 rows written" in h.message and "hsmon run" in h.message and "--rows-total" in h.message
    assert not [x for x in d.hints if x.severity == "critical"]


def test_total_not_reached_is_exited_and_says_how_far():
    d = decide(gone(exit_log="/x/log", exit_log_tail=[], rows_done=20, rows_total=30))
    assert d.state == "exited" and "20 of 30 expected rows" in d.reason
    assert "(empty)" in hint(d, "exited").message


def test_exited_when_no_log_file_is_known():
    d = decide(gone())
    assert d.state == "exited" and "no file hsmon could read" in hint(d, "exited").message


def test_process_never_seen_alive_but_output_there_is_exited_not_dead():
    proc = ProcessFacts("extractor", 42, False, "gone", seen_alive=False)
    assert decide(gone(processes=[proc], evidence_of_job=True)).state == "exited"


def test_an_event_writer_gone_without_done_is_still_dead():
    d = decide(gone(started=True, exit_log_tail=["fine"], rows_done=30))
    assert d.state == "dead"
    d = decide(gone(last_error="ValueError: x", exit_log="/r/job.log"))
    assert d.state == "dead" and "ValueError: x" in d.reason and "/r/job.log" in hint(d, "dead").message


def test_hsmon_run_still_recording_the_end_is_not_judged():
    d = decide(gone(started=True, runner_alive=True, events_watched=True, last_progress_ts=NOW - 1))
    assert d.state == "running"
    d = decide(gone(started=True, runner_alive=False, events_watched=True, last_progress_ts=NOW - 1))
    assert d.state == "dead"
    assert decide(gone(started=True, terminal_kind="done", runner_alive=True)).state == "done"


# -- the log tail classifier ------------------------------------------------------------------
def test_traceback_final_line_of_a_chained_exception():
    lines = ["Traceback (most recent call last):", "  x", "KeyError: 'a'", "",
             "During handling of the above exception, another exception occurred:", "",
             "Traceback (most recent call last):", "  y", "RuntimeError: second"]
    assert logtail.failure_line(lines) == "RuntimeError: second"


def test_a_traceback_survived_long_before_the_end_is_not_a_failure():
    lines = TRACEBACK + [f"packed row {i}" for i in range(13, 40)] + ["all done"]
    assert logtail.failure_line(lines) is None
    assert logtail.failure_line(["CUDA error: retrying"] + ["ok"] * 20) is None
    assert logtail.failure_line([]) is None and logtail.last_line(["a", "b", " "]) == "b"


def test_read_tail_drops_a_cut_first_line_and_keeps_progress_bars_last_state(tmp_path):
    log = tmp_path / "x.log"
    log.write_bytes(b"A" * 100 + b"\nrow 1\n 10%\r 50%\r100%\nend\n\n")
    assert logtail.read_tail(str(log), max_bytes=30) == ["row 1", "100%", "end"]
    assert logtail.read_tail(str(tmp_path / "missing")) is None


# -- the rotating log --------------------------------------------------------------------------
def test_rotation_at_line_boundaries_keeps_the_tail(tmp_path):
    path = str(tmp_path / "job.log")
    log = RotatingLog(path, max_bytes=100, backups=2)
    lines = [f"line {i:04d}\n".encode() for i in range(100)]
    for i in range(0, 100, 3):
        log.write(b"".join(lines[i:i + 3]))
    log.write(b"partial without newline")
    log.close()
    current = Path(path).read_bytes()
    one = Path(path + ".1").read_bytes()
    two = Path(path + ".2").read_bytes()
    assert (one + current).endswith(b"line 0099\npartial without newline") and current
    # the kept files are whole lines, contiguous, ending with the newest
    kept = (two + one + current).split(b"\n")
    nums = [int(x.split()[1]) for x in kept if x.startswith(b"line ")]
    assert nums == list(range(nums[0], 100)) and len(nums) >= 15
    assert all(len(b) <= 100 + 30 for b in (one, two))
    assert not (tmp_path / "job.log.3").exists() and log.rotations > 2
    assert log.lines_total == 100 and log.bytes_total == sum(map(len, lines)) + 23


def test_one_line_longer_than_the_limit_is_written_whole(tmp_path):
    path = str(tmp_path / "job.log")
    log = RotatingLog(path, max_bytes=10, backups=1)
    log.write(b"x" * 50 + b"\n")
    log.write(b"next\n")
    log.close()
    assert Path(path + ".1").read_bytes() == b"x" * 50 + b"\n"
    assert Path(path).read_bytes() == b"next\n"


# -- hsmon run's ending ------------------------------------------------------------------------
def test_ending_kinds():
    assert _ending(0, None, [])[0] == ev.DONE
    kind, fields = _ending(1, None, TRACEBACK)
    assert kind == ev.ERROR and fields["message"] == "ValueError: row 12 has no hidden states"
    assert fields["exit_code"] == 1 and fields["log_tail"] == TRACEBACK
    kind, fields = _ending(-signal.SIGKILL, None, ["row 3"])
    assert kind == ev.ERROR and fields["signal"] == "SIGKILL" and fields["message"] == "killed by SIGKILL"
    assert fields["exit_code"] is None
    assert _ending(-signal.SIGTERM, signal.SIGTERM, [])[0] == ev.STOPPED
    assert _ending(0, signal.SIGINT, [])[0] == ev.STOPPED
    assert _ending(130, signal.SIGINT, [])[0] == ev.STOPPED
    kind, fields = _ending(3, signal.SIGTERM, ["Killed"])
    assert kind == ev.ERROR and fields["forwarded_signal"] == "SIGTERM" and fields["message"] == "Killed"


def test_job_name_from_the_command():
    assert job_name(["python", "-u", "/x/02b_extract_hidden_states_sglang.py", "--n", "3"]) == (
        "02b_extract_hidden_states_sglang"
    )
    assert job_name(["python3", "-m", "mypkg.extract"]) == "mypkg.extract"
    assert job_name(["/usr/bin/env"]) == "env" and job_name(["python", "-c", "x"]) == "python"


def test_every_state_has_a_tui_badge_and_style():
    from hsmon.tui.view import STATE_STYLES
    from hsmon.tui.widgets.job_header import BADGE_STYLES

    assert set(STATES) <= set(BADGE_STYLES) and set(STATES) <= set(STATE_STYLES)


def test_an_ending_written_just_before_the_process_exits_is_never_read_as_dead(tmp_path):
    """The writer's last act races the daemon's tick: `done` appended, then the process exits,
    both between the daemon's first read of the events and its process check."""
    import subprocess
    import sys
    import time

    from hsmon.core.config import JobConfig
    from hsmon.core.job_runtime import JobRuntime

    events = tmp_path / "events.jsonl"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with ev.EventWriter("ex", events) as w:
            w.emit(ev.START, pid=child.pid, rows_total=3)
            w.emit(ev.ROWS, rows_done=1)
        rt = JobRuntime(JobConfig(name="ex", events=str(events), stall_after=30), time.time())
        rt.update(time.time(), scan_dump=False, scan_output=False)
        assert rt.decision.state == "running"
        real_poll = rt.poll_processes

        def writer_ends_then_exits():
            with ev.EventWriter("ex", events) as w:
                w.emit(ev.DONE, rows_done=3)
            child.kill()
            child.wait()
            return real_poll()

        rt.poll_processes = writer_ends_then_exits
        rt.update(time.time(), scan_dump=False, scan_output=False)
        assert rt.decision.state == "done", rt.decision
    finally:
        child.kill()
        child.wait()

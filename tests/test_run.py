"""`hsmon run` with real processes: exit 0, a traceback, SIGKILL, SIGTERM forwarded, output that is
never flushed, and a log rotated under a chatty child."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from daemon_helpers import child_env, wait_until

from hsmon.contracts.events import iter_events


def hsmon_run(tmp_path, script: str, *opts: str, wait: bool = True, job: str = "job"):
    """Runs a Python snippet under `hsmon run`; returns (process, events path, log path)."""
    path = tmp_path / f"{job}.py"
    path.write_text(textwrap.dedent(script))
    events, log = tmp_path / f"{job}.events.jsonl", tmp_path / f"{job}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hsmon", "run", "--job", job, "--events", str(events), *opts,
         "--", sys.executable, str(path)],
        env=child_env(), cwd=tmp_path, stderr=subprocess.PIPE, text=True,
    )
    if wait:
        proc.wait(timeout=60)
    return proc, events, log


def kinds(events) -> list[str]:
    return [e["kind"] for e in iter_events(events)]


def test_exit_0_is_done_with_start_fields_and_a_rotated_log_that_keeps_the_tail(tmp_path):
    proc, events, log = hsmon_run(
        tmp_path,
        """
        import sys
        for i in range(400):
            print(f"packed row {i:03d}")
        print("a warning on stderr", file=sys.stderr)
        """,
        "--rows-total", "400", "--log-max-bytes", "2000", "--log-backups", "2",
    )
    assert proc.returncode == 0, proc.stderr.read()
    evs = list(iter_events(events))
    assert evs[0]["kind"] == "start" and evs[-1]["kind"] == "done"
    start = evs[0]
    assert start["rows_total"] == 400 and start["cwd"] == str(tmp_path) and start["log"] == str(log)
    assert "job.py" in start["command"] and start["pid"] != proc.pid and start["runner_pid"] == proc.pid
    assert evs[-1]["exit_code"] == 0 and evs[-1]["log_lines"] == 401
    assert os.path.exists(f"{log}.1") and os.path.exists(f"{log}.2") and not os.path.exists(f"{log}.3")
    text = "".join(Path(p).read_text() for p in (f"{log}.2", f"{log}.1", log))
    assert text.endswith("packed row 399\na warning on stderr\n") and log.stat().st_size  # the tail kept
    kept = text.splitlines()
    rows = [int(line.split()[-1]) for line in kept if line.startswith("packed")]
    assert rows == list(range(rows[0], 400))  # contiguous: rotation lost no line of what it kept


def test_a_traceback_is_an_error_with_the_exception_line_and_the_exit_code(tmp_path):
    proc, events, log = hsmon_run(
        tmp_path,
        """
        print("packed row 0")
        def pack(row):
            raise ValueError(f"row {row} has no hidden states")
        pack(12)
        """,
    )
    assert proc.returncode == 1
    end = list(iter_events(events))[-1]
    assert end["kind"] == "error" and end["exit_code"] == 1
    assert end["message"] == "ValueError: row 12 has no hidden states"
    assert end["log_tail"][0] == "packed row 0" and "Traceback" in log.read_text()


def test_sigkill_is_an_error_with_the_signal(tmp_path):
    proc, events, _ = hsmon_run(tmp_path, "import os\nprint('x')\nos.kill(os.getpid(), 9)")
    assert proc.returncode == 128 + signal.SIGKILL
    end = list(iter_events(events))[-1]
    assert end["kind"] == "error" and end["signal"] == "SIGKILL" and end["exit_code"] is None
    assert "SIGKILL" in end["message"]


def test_unflushed_output_appears_at_once_and_sigterm_reaches_the_child(tmp_path):
    proc, events, log = hsmon_run(
        tmp_path,
        """
        import signal, sys, time
        def term(signum, frame):
            print("child got SIGTERM, checkpointing")
            sys.exit(0)
        signal.signal(signal.SIGTERM, term)
        print("packed row 0")  # no flush: buffered unless PYTHONUNBUFFERED
        time.sleep(60)
        """,
        wait=False,
    )
    try:
        wait_until(lambda: log.exists() and "packed row 0" in log.read_text(), 15, what="the unflushed line")
        child = next(iter_events(events))["pid"]
        assert proc.poll() is None and os.path.exists(f"/proc/{child}")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert "child got SIGTERM, checkpointing" in log.read_text()
    end = list(iter_events(events))[-1]
    assert end["kind"] == "stopped" and end["forwarded_signal"] == "SIGTERM" and end["exit_code"] == 0
    assert not os.path.exists(f"/proc/{child}")


def test_bad_command_lines_are_one_clear_line(tmp_path):
    res = subprocess.run([sys.executable, "-m", "hsmon", "run", "--job", "x"], env=child_env(), cwd=tmp_path,
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "no command given" in res.stderr and len(res.stderr.splitlines()) == 1
    res = subprocess.run([sys.executable, "-m", "hsmon", "run", "--job", "x", "--", str(tmp_path / "nope")],
                         env=child_env(), cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert res.returncode == 127 and "cannot start" in res.stderr
    assert kinds(tmp_path / "x.events.jsonl") == ["error"]

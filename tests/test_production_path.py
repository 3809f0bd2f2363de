"""The production path, written whole, the parts that need no SGLang server:
sglang-serve names the Python it tried and how to install SGLang; a daemon given only --out and
--events takes the dump directory and the job's name from the start event, as it takes the servers
(README's production commands with a real server: tests/test_readme_production.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from daemon_helpers import Daemon, Procs, child_env, wait_until

from hsmon.contracts import events as ev


def test_sglang_serve_without_sglang_names_the_python_and_the_install(tmp_path: Path) -> None:
    argv = ["sglang-serve", "--model-path", "embedded", "--python", sys.executable, "--port", "0"]
    done = subprocess.run([sys.executable, "-m", "hsmon", *argv], capture_output=True, text=True, timeout=120,
                          env=child_env())
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"hsmon sglang-serve: --python {sys.executable}: no sglang importable in this "
                           "Python; make sglang-env builds a CPU one"), line
    assert "pip install 'sglang[all]'" in line and "then pass --python DIR/bin/python" in line, line


def test_a_daemon_takes_the_dump_directory_and_the_name_from_the_start_event(tmp_path: Path) -> None:
    out, events, dump = tmp_path / "out", tmp_path / "events.jsonl", tmp_path / "shm" / "extract-big-1a2b"
    out.mkdir()
    procs = Procs()
    try:
        daemon = Daemon(procs, tmp_path, ["--out", str(out), "--events", str(events), "--scan-interval",
                                          "0.3"])
        assert [j["job"] for j in daemon.status()["jobs"]] == ["job"]  # no event yet: the default name
        dump.mkdir(parents=True)
        with ev.EventWriter("extract-big", str(events)) as writer:
            writer.emit(ev.START, rows_total=10, tokens_total=100, pid=procs.start(
                [sys.executable, "-c", "import time; time.sleep(60)"]).pid, dump_dir=str(dump))
            job = wait_until(lambda: (jobs := daemon.status()["jobs"]) and jobs[0]["job"] == "extract-big"
                             and jobs[0]["dump"] and jobs[0], 30, 0.2, what="the job renamed, its dump seen")
            assert job["dump"]["path"] == str(dump), job["dump"]
            for k in range(3):  # the dumps of three requests, consumed
                (dump / f"r{k}.pt").write_bytes(b"x" * 100)
                time.sleep(0.3)
                (dump / f"r{k}.pt").unlink()
            writer.emit(ev.ROWS, rows=3, tokens=30, rows_done=3, tokens_done=30)
            seen = wait_until(lambda: (d := daemon.job("extract-big")["dump"])["consumed_total"] >= 3 and d,
                              30, 0.2, what="the dumps counted")
            assert seen["created_total"] == 3 and seen["files"] == 0, seen
        disks = {d["role"]: d["path"] for d in daemon.job("extract-big")["disk"]}
        assert "shm" in disks, disks  # the dump directory's filesystem is watched too
    finally:
        procs.close()

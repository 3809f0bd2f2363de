"""bench/online.py's processes: each side started pinned to its core, reaped with its CPU seconds and
(the trainer) its scheduler account."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.online_times import SchedWatch

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def hsmon(*args: str) -> list[str]:
    return [sys.executable, "-m", "hsmon", *args]


def pin(core: int | None) -> Any:
    """A preexec_fn that binds the child (and every thread it starts) to one core, or None."""
    if core is None:
        return None
    return lambda: os.sched_setaffinity(0, {core})


CPU: dict[str, float] = {}  # CPU seconds (user + system) of each process the bench waited for, by name
SCHED: dict[str, tuple[float, float]] = {}  # the trainer's (on a CPU, waiting for one) seconds, online/alone


def reap(proc: subprocess.Popen[bytes], name: str) -> int:
    """Wait for a child, record its CPU seconds under ``name`` (its rusage); returns its exit code."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    CPU[name] = usage.ru_utime + usage.ru_stime
    return proc.returncode


def run(cmd: list[str], log: Path, core: int | None = None, name: str = "") -> float:
    """Run to the end (exit 0 required); returns the wall seconds."""
    started = time.monotonic()
    proc = start(cmd, log, core)
    watch = SchedWatch(proc.pid)
    code = reap(proc, name or cmd[3])
    SCHED[name] = watch.close()
    if code != 0:
        raise SystemExit(f"bench/online.py: {' '.join(cmd[2:5])} failed ({proc.returncode}); see {log}")
    return time.monotonic() - started


def start(cmd: list[str], log: Path, core: int | None = None,
          env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with open(log, "ab") as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=fh, env={**ENV, **(env or {})}, cwd=ROOT,
                                preexec_fn=pin(core))


def cores_of(text: str | None) -> tuple[int | None, int | None]:
    """(the extractor's core, the trainer's core): --cores A,B, else the first two this process may
    use; (None, None) with fewer than two (then nothing is pinned)."""
    if text:
        a, b = (int(x) for x in text.split(","))
        return a, b
    allowed = sorted(os.sched_getaffinity(0))
    return (allowed[0], allowed[1]) if len(allowed) >= 2 else (None, None)


def load() -> str:
    return ",".join(f"{x:.2f}" for x in os.getloadavg())


def wait_ok(proc: subprocess.Popen[bytes], what: str, name: str = "") -> None:
    if reap(proc, name or what) != 0:
        raise SystemExit(f"bench/online.py: {what} failed ({proc.returncode})")


def wait_for(predicate: Any, timeout: float = 1800) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit("bench/online.py: timed out")
        time.sleep(0.05)

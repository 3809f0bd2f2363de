"""bench/soak.py's warm-up: a fast churn of finished jobs before the measured run, so that the
daemon's allocators reach their high-water mark first and the RSS slope measures creep.

The daemon's RSS rises while jobs come and go and levels off after about a thousand jobs, with
Python's live memory flat all along (docs/benchmarks.md, "Soak"): memory freed by retired jobs
is kept by glibc's and Python's allocators (free chunks, arenas with a block still in use) and
reused, not a leak. A 60-minute soak sees ~320 jobs, not enough for that level; this churn gives
the daemon ``jobs`` jobs first: every cycle a reload swaps 20 jobs for 20 new ones, each reading
one of three finished writers' files (events only; + output and manifest; + a dump dir), while
/metrics and /api/v1/status are read.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WRITER = REPO / "bench" / "_soak_writer.py"
AT_ONCE = 20


def prewarm(daemon: subprocess.Popen[bytes], url: str, cfg: Path, head: str, tmp: Path, jobs: int) -> None:
    """``jobs`` finished jobs through the daemon, AT_ONCE at a time; ``head``: the config's
    [daemon] table and anchor job; the configuration is left as ``head`` (no warm-up job)."""
    warm = tmp / "warm"
    warm.mkdir()
    for i in range(3):
        cmd = [sys.executable, str(WRITER), str(warm / f"e{i}.jsonl"), f"warm{i}", "60", str(i), "none",
               "--rate", "1e7"]
        cmd += ["--out", str(warm / f"o{i}")] if i else []
        cmd += ["--dump", str(warm / f"d{i}")] if i == 2 else []
        subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    (warm / "pid").write_text(str(os.getpid()))
    for first in range(0, jobs + AT_ONCE, AT_ONCE):
        text = head
        for n in range(first, min(first + AT_ONCE, jobs)):
            i = n % 3
            text += f'\n[[job]]\nname = "warm{n:05d}"\nevents = "{warm}/e{i}.jsonl"\npidfile = "{warm}/pid"\n'
            text += f'out_dir = "{warm}/o{i}"\n' if i else ""
            text += f'dump_dir = "{warm}/d{i}"\n' if i == 2 else ""
        cfg.write_text(text)
        daemon.send_signal(signal.SIGHUP)
        stop = time.monotonic() + 2.0
        while time.monotonic() < stop:
            for path in ("/metrics", "/api/v1/status"):
                with urllib.request.urlopen(url + path, timeout=10) as resp:
                    resp.read()
            time.sleep(0.2)

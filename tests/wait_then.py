"""Waits until a file exists, then runs a Python script in this same process (same PID), as if
started with `python SCRIPT ARGS...`: lets a test start a job first and let it work only once the
daemon watches it.

    python tests/wait_then.py GOFILE SCRIPT [ARGS...]
"""

from __future__ import annotations

import os
import runpy
import sys
import time

if __name__ == "__main__":
    go, script, *args = sys.argv[1:]
    deadline = time.monotonic() + 60
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.05)
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")

"""An extraction's stop signals: the first SIGINT or SIGTERM asks for a stop at the next row boundary,
the other signal after it is the same request (Ctrl-C reaches the whole process group and a parent
such as `hsmon online` then forwards SIGTERM: before, that second signal made the extractor leave at
once, with no record of how it stopped), and the same signal twice leaves at once (exit 128 + it).
Real signals to a real child process, in the order the race delivers them, no timing involved."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import os, signal, sys
    from extractor.run import StopRequest, install_stop_handlers
    stop = StopRequest()
    install_stop_handlers(stop)
    for name in sys.argv[1:]:
        os.kill(os.getpid(), getattr(signal, name))  # handled before kill returns (same thread)
    print("still here", stop.is_set(), stop.signum, flush=True)
""")


def run_child(*signals: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CHILD, *signals], capture_output=True, text=True, timeout=60)


def test_sigint_then_forwarded_sigterm_is_one_stop_named_sigint() -> None:
    done = run_child("SIGINT", "SIGTERM")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["still", "here", "True", str(int(signal.SIGINT))]


def test_the_same_signal_twice_leaves_at_once() -> None:
    done = run_child("SIGINT", "SIGINT")
    assert done.returncode == 128 + signal.SIGINT, done.stdout + done.stderr
    assert "still here" not in done.stdout

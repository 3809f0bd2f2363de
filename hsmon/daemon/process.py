"""`hsmon daemon` as a child process: started, and its URL once it listens (the demo, `hsmon online`,
the benches and the tests start it this way)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


class DaemonStartError(RuntimeError):
    """`hsmon daemon` exited, or did not listen in time, when started by :func:`spawn`."""


def spawn(
    options: list[str],
    port_file: str | os.PathLike[str],
    *,
    port: int = 0,
    host: str = "127.0.0.1",
    timeout: float = 30.0,
    **popen: Any,
) -> tuple[subprocess.Popen[bytes], str]:
    """Start `hsmon daemon OPTIONS` as a child process and wait until it listens.

    The daemon binds ``host``:``port`` (0: a free port) and writes the port to ``port_file``.
    Returns the process and its base URL. ``popen`` goes to :class:`subprocess.Popen` (env,
    stdout, stderr). Raises :class:`DaemonStartError` when the daemon exits first or does not
    listen within ``timeout`` seconds (it is then killed).
    """
    port_path = Path(port_file)
    port_path.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "hsmon", "daemon", *options,
            "--host", host, "--port", str(port), "--port-file", str(port_path)]
    proc: subprocess.Popen[bytes] = subprocess.Popen(argv, **popen)
    deadline = time.monotonic() + timeout
    while not port_path.exists():
        if proc.poll() is not None:
            raise DaemonStartError(f"hsmon daemon exited with status {proc.returncode} before listening")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise DaemonStartError(f"hsmon daemon did not listen within {timeout:g} s")
        time.sleep(0.05)
    return proc, f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{int(port_path.read_text())}"

"""A training launched by the daemon's unit runs as a transient unit of its own (`systemd-run`).

Inside hsmon-daemon.service a child would share the daemon's sandbox (a read-only filesystem, no
devices: it could neither write its output nor see a GPU) and its cgroup (`systemctl restart
hsmon-daemon` would kill it). A transient service has neither: it gets the output directory to
write, the GPUs, the daemon's user, and it outlives the daemon. Elsewhere (a shell, a container,
no systemd as PID 1) the training runs in a detached session of its own, as before.

    argv = unit_argv(unit_name(req), req, argv, user)   # the systemd-run command line
    pid = main_pid(unit)                                 # the training's PID once it runs

The daemon's user needs the right to start units named hsmon-train-*: `hsmon install-units` writes
the polkit rule for it (hsmon/systemd/hsmon-train-units.rules).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

UNIT_PREFIX = "hsmon-train-"
MODE_ENV = "HSMON_LAUNCH_MODE"  # "unit" or "session": force one (default: unit under systemd)


def wanted() -> bool:
    """Launch as a transient unit? Under a systemd service (INVOCATION_ID set by systemd, systemd
    as PID 1, systemd-run present), unless HSMON_LAUNCH_MODE says otherwise."""
    mode = os.environ.get(MODE_ENV, "")
    if mode in ("unit", "session"):
        return mode == "unit"
    return (bool(os.environ.get("INVOCATION_ID")) and os.path.isdir("/run/systemd/system")
            and shutil.which("systemd-run") is not None)


def unit_name(job: str, now: float | None = None) -> str:
    """A unit name of the job's, unique per launch (a finished unit is collected, not reused)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "-", job)[:80]
    return f"{UNIT_PREFIX}{safe}-{int((now or time.time()) * 1000) % 10**10}.service"


def unit_argv(unit: str, argv: list[str], out_dir: str, log_path: str, user: str | None = None,
              env: dict[str, str] | None = None) -> list[str]:
    """The systemd-run command that runs ``argv`` as ``unit``: the output directory writable, the
    devices (GPUs) visible, unbuffered output appended to the log, stopped by SIGTERM with time to
    write its checkpoint, collected once it ends."""
    cmd = [shutil.which("systemd-run") or "systemd-run", "--unit", unit, "--collect", "--quiet",
           "--description", f"hsmon training {unit.removesuffix('.service')}",
           "--property", f"WorkingDirectory={out_dir}",
           "--property", f"StandardOutput=append:{log_path}",
           "--property", f"StandardError=append:{log_path}",
           "--property", "KillSignal=SIGTERM",
           "--property", "SuccessExitStatus=130 143",  # a training stopped by a signal exits 128 + it
           "--property", "KillMode=mixed",
           "--property", "TimeoutStopSec=15min",
           "--property", "UMask=0027",
           "--setenv", "PYTHONUNBUFFERED=1"]
    if user:
        cmd += ["--uid", user, "--gid", user]
    for key in ("HSMON_TRAIN_COMMAND", "CUDA_VISIBLE_DEVICES", "PYTHONPATH", "PATH"):
        value = (env or os.environ).get(key)
        if value:
            cmd += ["--setenv", f"{key}={value}"]
    return [*cmd, "--", *argv]


def main_pid(unit: str, timeout: float = 10.0) -> int | None:
    """The unit's main PID once systemd reports it (None if it never does within ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        res = subprocess.run(["systemctl", "show", "--property", "MainPID", "--value", unit],
                             capture_output=True, text=True, timeout=10)
        pid = res.stdout.strip()
        if pid.isdigit() and int(pid) > 0:
            return int(pid)
        time.sleep(0.2)
    return None

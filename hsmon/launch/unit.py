"""A training launched by the daemon's unit runs as an instance of the template unit
``hsmon-launch@.service`` (hsmon/systemd/), never as a transient unit the daemon describes.

Inside hsmon-daemon.service a child would share the daemon's sandbox (a read-only filesystem, no
devices: it could neither write its output nor see a GPU) and its cgroup (`systemctl restart
hsmon-daemon` would kill it). The template's instances have neither, and nothing about them is the
daemon's to choose but the instance name: the unit file (root's) fixes the user, the sandbox and
the command, ``hsmon launched STATE/launch/INSTANCE.json``, which reads the launch the daemon wrote
into its state directory (hsmon/launch/child.py). The polkit rule install-units writes
(hsmon/systemd/hsmon-launch.rules) lets the daemon's user start and stop those instances and
nothing else: a transient unit of that name is refused by systemd itself (the template's file
exists), and one of any other name by the rule. Elsewhere (a shell, a container, no systemd as
PID 1) the training runs in a detached session of its own.

    unit, pid = start(job, spec, env)      # the spec written, the instance started, its main PID
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time

import msgspec

from hsmon.contracts.layout import atomic_write

TEMPLATE = "hsmon-launch@.service"
INSTANCE_RE = re.compile(r"[A-Za-z0-9_.-]{1,120}")
MODE_ENV = "HSMON_LAUNCH_MODE"  # "unit" or "session": force one (default: unit under systemd)
SPEC_DIR = "launch"  # below the daemon's StateDirectory (/var/lib/hsmon): the template reads it there
SPEC_KEEP_S = 7 * 86400.0


def wanted() -> bool:
    """Launch as a unit? Under a systemd service (INVOCATION_ID set by systemd, systemd as PID 1,
    systemctl present), unless HSMON_LAUNCH_MODE says otherwise."""
    mode = os.environ.get(MODE_ENV, "")
    if mode in ("unit", "session"):
        return mode == "unit"
    return (bool(os.environ.get("INVOCATION_ID")) and os.path.isdir("/run/systemd/system")
            and shutil.which("systemctl") is not None)


def instance_name(job: str, now: float | None = None) -> str:
    """An instance name of the job's, unique per launch (a finished instance is collected)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "-", job)[:80]
    return f"{safe}-{int((now or time.time()) * 1000) % 10**10}"


def unit_of(instance: str) -> str:
    if not INSTANCE_RE.fullmatch(instance):
        raise ValueError(f"instance name {instance!r}: letters, digits, _ . - only")
    return TEMPLATE.replace("@.", f"@{instance}.")


def spec_dir(env: dict[str, str]) -> str:
    """Where the daemon writes its launches: STATE_DIRECTORY/launch (OSError, one line, when the
    daemon runs without a StateDirectory)."""
    state = (env.get("STATE_DIRECTORY") or "").split(":")[0]
    if not state:
        raise OSError("launching a training as a unit needs the daemon's StateDirectory= (STATE_DIRECTORY is "
                      f"not set): run the daemon from hsmon-daemon.service, or set {MODE_ENV}=session")
    return os.path.join(state, SPEC_DIR)


def write_spec(directory: str, instance: str, spec: msgspec.Struct, now: float | None = None) -> str:
    """The launch, as the template's `hsmon launched` reads it; launches older than a week pruned."""
    now = now or time.time()
    os.makedirs(directory, mode=0o750, exist_ok=True)
    for entry in os.scandir(directory):
        if entry.name.endswith(".json") and entry.is_file(follow_symlinks=False):
            with contextlib.suppress(OSError):
                if now - entry.stat(follow_symlinks=False).st_mtime > SPEC_KEEP_S:
                    os.unlink(entry.path)
    path = os.path.join(directory, f"{instance}.json")
    atomic_write(path, lambda fh: fh.write(msgspec.json.encode(spec)))
    return path


def start_argv(unit: str) -> list[str]:
    return [shutil.which("systemctl") or "systemctl", "start", unit]


def start(job: str, spec: msgspec.Struct, env: dict[str, str]) -> tuple[str, int]:
    """Write the launch and start its instance; (unit, main PID). OSError with systemctl's own
    words (one line) when it refuses."""
    instance = instance_name(job)
    unit = unit_of(instance)
    write_spec(spec_dir(env), instance, spec)
    res = subprocess.run(start_argv(unit), capture_output=True, text=True, timeout=60, env=env)
    if res.returncode != 0:
        why = (res.stderr.strip().splitlines() or [f"exit status {res.returncode}"])[-1]
        raise OSError(f"systemctl could not start {unit}: {why} (docs/operations.md, 'The units')")
    pid = main_pid(unit)
    if pid is None:
        raise OSError(f"{unit} started but systemd reports no main PID; see journalctl -u {unit}")
    return unit, pid


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

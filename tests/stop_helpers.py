"""A command run as a terminal's foreground job, for the tests of Ctrl-C and a lost terminal.

    job = Foreground([sys.executable, "-m", "hsmon", "train", ...], tmp_path)
    job.wait_for(lambda: ..., "its first step")
    job.signal(signal.SIGINT)       # what Ctrl-C does: SIGINT to every process of the group
    assert job.wait() == 130
    assert job.left() == ([], [])   # (processes still running, /dev/shm files they held)

The command gets a session (and process group) of its own, as a shell gives a job; every process of
its tree is remembered while it runs, with the /dev/shm files each holds open or mapped, so that
what outlives the command (a child adopted by PID 1, a segment never unlinked) is found by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from daemon_helpers import child_env

SHM = "/dev/shm/"


class Foreground:
    def __init__(self, argv: list[str], tmp: Path, env: dict[str, str] | None = None,
                 name: str = "job") -> None:
        self.tmp = tmp
        self.stdout_path, self.stderr_path = tmp / f"{name}.out", tmp / f"{name}.err"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                         env=env or child_env(), start_new_session=True)
        self.seen: dict[int, psutil.Process] = {}
        self.shm: set[str] = set()
        self.remember()

    def remember(self) -> None:
        """Note the processes of the tree (and the ones of its group) and the /dev/shm files they hold."""
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.proc.pid)
            for proc in [root, *root.children(recursive=True)]:
                self.seen.setdefault(proc.pid, proc)
        for pid in list(self.seen):
            self.shm.update(shm_held_by(pid))

    def wait_for(self, cond: Callable[[], Any], what: str, timeout: float = 240) -> Any:
        """Wait for ``cond`` while the command runs (remembering its tree); fail if it ends first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.remember()
            found = cond()
            if found:
                return found
            assert self.proc.poll() is None, f"ended ({self.proc.returncode}) before {what}:\n{self.output()}"
            time.sleep(0.2)
        raise AssertionError(f"no {what} after {timeout:.0f} s:\n{self.output()}")

    def signal(self, signum: int) -> None:
        """Signal the whole process group, as the terminal does (Ctrl-C, a hang-up)."""
        self.remember()
        os.killpg(self.proc.pid, signum)

    def wait(self, timeout: float = 180) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"running {timeout:.0f} s after the signal:\n{self.output()}") from None

    def left(self, marker: str | None = None) -> tuple[list[str], list[str]]:
        """(commands still running, /dev/shm files still there) of what the command started, a few
        seconds after it ended; ``marker`` (default: the test's directory) finds processes by their
        command line too (a child started after the last look)."""
        marker = marker or str(self.tmp)
        deadline = time.monotonic() + 10
        while True:
            alive = {p.pid: p for p in self.seen.values() if _running(p)}
            for proc in psutil.process_iter(["cmdline"]):
                with contextlib.suppress(psutil.Error):
                    if marker in " ".join(proc.info["cmdline"] or ()) and _running(proc):
                        alive[proc.pid] = proc
            files = sorted(path for path in self.shm if os.path.exists(path))
            if (not alive and not files) or time.monotonic() > deadline:
                names = [" ".join(_cmdline(p))[:200] for p in alive.values()]
                return names, files
            time.sleep(0.3)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for proc in self.seen.values():
            with contextlib.suppress(psutil.Error):
                proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)

    def stderr_lines(self) -> list[str]:
        return [line for line in self.stderr_path.read_text(errors="replace").splitlines() if line.strip()]

    def output(self) -> str:
        return (self.stdout_path.read_text(errors="replace")[-3000:] + "\n--- stderr ---\n"
                + self.stderr_path.read_text(errors="replace")[-3000:])


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return [f"pid {proc.pid}"]


def shm_held_by(pid: int) -> set[str]:
    """The /dev/shm files a process has mapped or open (/proc/PID/maps and fd: what psutil's
    memory_maps would give, without reading smaps)."""
    held = set()
    with contextlib.suppress(OSError), open(f"/proc/{pid}/maps", errors="replace") as maps:
        for line in maps:
            at = line.find(SHM)
            if at >= 0:
                held.add(line[at:].rstrip("\n").removesuffix(" (deleted)"))
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(SHM):
                    held.add(target)
    return held

"""The supervision of an engine's server by `hsmon sglang-serve` and `hsmon vllm-serve`: start it, say
when it is ready (SGLang: its capture plugin loaded), forward the stop signals, and leave nothing
behind whatever ended it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable

from extractor.sglang.shm_leftovers import ShmLeftovers
from hsmon.contracts import stop_signals


def _ready(url: str) -> bool:
    """SGLang answers /health with 200 once its warm-up request went through."""
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as resp:
            return resp.status == 200
    except (OSError, urllib.error.URLError):
        return False


def _plugin_loaded(url: str) -> str | None:
    """SGLang's readiness check: None when hsmon's capture plugin runs in the server, else why not."""
    with urllib.request.urlopen(url + "/server_info", timeout=10) as resp:
        if "hsmon_plugin_version" in json.loads(resp.read()):
            return None
    return "the server runs but the capture plugin did not load; see the server log above"


def _exit_status(code: int) -> int:
    return 128 - code if code < 0 else code


class ServerChild:
    """SGLang's main process and what it spawned (scheduler, detokenizer, ...).

    SGLang stays in sglang-serve's process group, so whoever stops sglang-serve's group (a
    terminal, systemd, a test) stops SGLang too. The descendants are remembered while the main
    process lives: if it dies first they are orphaned and would otherwise hold the port.
    """

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        import psutil

        self.proc = subprocess.Popen(cmd, env=env)
        self._psutil = psutil
        self._known: dict[int, object] = {}

    def remember(self) -> None:
        with contextlib.suppress(self._psutil.Error):
            for p in self._psutil.Process(self.proc.pid).children(recursive=True):
                self._known.setdefault(p.pid, p)

    def signal(self, signum: int) -> None:
        # To the main process only: it shuts its scheduler and detokenizer down itself
        # (signalling them all at once makes it report a crashed child first).
        self.remember()
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signum)

    def kill_all(self) -> None:
        self.remember()
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        for p in self._known.values():
            with contextlib.suppress(self._psutil.Error):
                p.kill()  # psutil checks the process is still the one remembered (no pid reuse)
        # gone, not only signalled: what they held in /dev/shm is free once they are
        self._psutil.wait_procs(list(self._known.values()), timeout=10)

    def stop(self, grace: float = 30) -> None:
        self.signal(signal.SIGTERM)
        self.wait_or_kill(grace)

    def wait_or_kill(self, grace: float = 30) -> None:
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.kill_all()
            self.proc.wait()


def stop_session(proc: subprocess.Popen, grace: float = 30) -> None:
    """Stop a child started in a session of its own (`hsmon sglang-serve` with SGLang under it, a
    daemon) and everything in its process group, even when the leader itself has already exited:
    SIGTERM to the group, SIGKILL to what is left of it after ``grace`` seconds. (The group's id is
    the leader's PID, which the kernel does not hand out again while a member of the group lives.)"""
    _signal_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if proc.poll() is None or _group_alive(proc.pid):
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait()


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _group_alive(pgid: int) -> bool:
    """True while a process of the group lives (a member not yet reaped counts: it is gone soon)."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def supervise(cmd: list[str], env: dict[str, str], url: str, ready_timeout: float,
              program: str = "sglang-serve",
              loaded: Callable[[str], str | None] | None = _plugin_loaded) -> int:
    """Run the engine's server until it ends or a signal stops it; its exit status (128 + a signal's
    number). ``loaded``: a check once /health answers (None: fine, else the refusal in words)."""
    leftovers = ShmLeftovers()
    child = ServerChild(cmd, env)
    proc = child.proc
    stop = {"signal": 0}

    def forward(signum: int, _frame: object) -> None:
        if stop["signal"] and signum != signal.SIGHUP:  # a second Ctrl-C: no more waiting
            child.kill_all()
        stop["signal"] = stop["signal"] or signum
        child.signal(signal.SIGTERM if signum == signal.SIGHUP else signum)  # the server's own stop

    old = stop_signals.install(forward)  # SIGINT, SIGTERM, and SIGHUP: a lost terminal stops it too
    try:
        started = time.monotonic()
        announced = False
        while proc.poll() is None:
            child.remember()
            if not announced and not stop["signal"] and _ready(url):
                refusal = loaded(url) if loaded is not None else None
                if refusal:
                    print(f"hsmon {program}: {refusal}", file=sys.stderr, flush=True)
                    child.stop()
                    return 1
                print(f"hsmon {program}: ready at {url}", flush=True)
                announced = True
            if not announced and ready_timeout and time.monotonic() - started > ready_timeout:
                print(f"hsmon {program}: not ready after {ready_timeout:g} s; stopping it",
                      file=sys.stderr, flush=True)
                child.stop()
                return 1
            if stop["signal"]:
                child.wait_or_kill()
                break
            time.sleep(1.0)
        code = _exit_status(proc.wait())  # the server's own (the units count its stop as theirs)
        if stop["signal"]:
            how = stop_signals.described(stop["signal"])
            stop_signals.say(f"hsmon {program}: stopped by {how}; the server exited with status {code}")
        return code
    finally:
        stop_signals.restore(old)
        child.kill_all()  # whatever the engine left behind
        removed = leftovers.sweep()
        if removed:
            shown = ", ".join(removed[:3]) + (", ..." if len(removed) > 3 else "")
            stop_signals.say(f"hsmon {program}: removed {len(removed)} file(s) the server left in "
                             f"{leftovers.shm} ({shown})")

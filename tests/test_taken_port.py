"""A taken port ends every command that serves one in one line naming the port and what holds it:
real commands on a port a real process holds, before anything heavy starts
(`sglang-serve` and `vllm-serve` used to load the model and die in the server's traceback; the daemon
died in two tracebacks, `OSError: [Errno 98]` then `AttributeError: ... '_threads'`)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_helpers import Daemon, Procs, child_env, free_port

HELD_BY_SCRIPT = "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); " \
                 "print(s.getsockname()[1], flush=True); time.sleep(120)"


@pytest.fixture(scope="module")
def procs() -> Iterator[Procs]:
    p = Procs()
    yield p
    p.close()


@pytest.fixture(scope="module")
def held_port(procs: Procs) -> tuple[int, int]:
    """(port, PID) of a plain Python process listening on loopback."""
    proc = procs.start([sys.executable, "-c", HELD_BY_SCRIPT], stdout=subprocess.PIPE, text=True)
    return int(proc.stdout.readline()), proc.pid


@pytest.fixture(scope="module")
def other_daemon(procs: Procs, tmp_path_factory: pytest.TempPathFactory) -> Daemon:
    base = tmp_path_factory.mktemp("held")
    return Daemon(procs, base, ["--out", str(base / "out"), "--job", "extract-big", "--scan-interval", "5"])


def hsmon(*argv: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "hsmon", *argv], capture_output=True, text=True,
                          timeout=timeout, env=child_env())
    return done, time.monotonic() - started


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def port_of(daemon: Daemon) -> int:
    return int(daemon.url.rsplit(":", 1)[1])


def test_a_second_daemon_names_the_first_and_its_jobs(other_daemon: Daemon, tmp_path: Path) -> None:
    port = port_of(other_daemon)
    done, _ = hsmon("daemon", "--out", str(tmp_path), "--port", str(port))
    pid = other_daemon.proc.pid
    assert one_line(done) == (
        f"hsmon daemon: port {port} on 127.0.0.1 is taken by another hsmon daemon (PID {pid}, "
        "watching jobs extract-big): stop it, or give another --port (0: any free port)")


def test_a_daemon_beside_another_program_names_its_pid_and_command(held_port: tuple[int, int],
                                                                    tmp_path: Path) -> None:
    port, pid = held_port
    done, _ = hsmon("daemon", "--out", str(tmp_path), "--port", str(port))
    line = one_line(done)
    assert line.startswith(f"hsmon daemon: port {port} on 127.0.0.1 is taken by PID {pid} "
                           f"({sys.executable} -c import socket, time;"), line
    assert line.endswith("...): stop it, or give another --port (0: any free port)"), line


def test_an_address_not_of_this_machine_is_one_line_too(tmp_path: Path) -> None:
    done, _ = hsmon("daemon", "--out", str(tmp_path), "--host", "192.0.2.1", "--port", "9108")
    assert one_line(done) == (
        "hsmon daemon: cannot listen on 192.0.2.1:9108: Cannot assign requested address: "
        "give an address of this machine (127.0.0.1 for this machine only, 0.0.0.0 for all)")


@pytest.mark.parametrize("command", ["sglang-serve", "vllm-serve"])
def test_a_server_on_a_taken_port_is_refused_before_the_engine_starts(command: str,
                                                                       other_daemon: Daemon) -> None:
    """Refused in seconds, before SGLang or vLLM loads anything (the engine's own check comes after
    the model load: 40 s here, minutes on a GPU node)."""
    port = port_of(other_daemon)
    done, took = hsmon(command, "--model-path", "embedded", "--port", str(port), "--python", sys.executable)
    assert one_line(done) == (
        f"hsmon {command}: port {port} on 127.0.0.1 is taken by another hsmon daemon "
        f"(PID {other_daemon.proc.pid}, watching jobs extract-big): stop it, or give another --port")
    assert took < 20, took


def test_the_demo_on_a_taken_port_says_so_before_it_prepares_anything(other_daemon: Daemon,
                                                                      tmp_path: Path) -> None:
    port = port_of(other_daemon)
    done = subprocess.run([sys.executable, "-m", "hsmon.demo", str(tmp_path / "demo"), "--headless",
                           "--port", str(port)], capture_output=True, text=True, timeout=60, env=child_env())
    pid = other_daemon.proc.pid
    assert one_line(done) == (
        f"demo: port {port} on 127.0.0.1 is taken by another hsmon daemon (PID {pid}, watching "
        'jobs extract-big): stop it, or give another --port (DEMO_ARGS="--port N"; 0: any free port)')
    assert done.stdout == "" and not (tmp_path / "demo").exists()


def test_a_daemon_on_a_free_port_given_by_number_serves(tmp_path: Path) -> None:
    """The check takes nothing: the port it found free is the one the daemon then listens on."""
    port = free_port()
    procs = Procs()
    try:
        daemon = Daemon(procs, tmp_path, ["--out", str(tmp_path)], port=port)
        assert port_of(daemon) == port and daemon.status()["jobs"]
    finally:
        procs.close()

"""Helpers for the monitor/daemon tests: real processes, cleaned up even on failure."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from extractor.sglang.ports import free_stable_port
from hsmon import daemon as daemon_process

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
STORY = str(TESTS / "story_job.py")
STANDIN_TRAIN = str(TESTS / "standin_train.py")


def child_env(**extra: str) -> dict[str, str]:
    """The test's environment for a child, with this checkout importable and Python buffered as by
    default (PYTHONUNBUFFERED removed: the original job's trap must be reproducible)."""
    env = dict(os.environ)
    env.pop("PYTHONUNBUFFERED", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def wait_until(cond: Callable[[], Any], timeout: float = 20.0, interval: float = 0.1, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = cond()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or cond}; last value {last!r}")


class Procs:
    """Starts real processes and kills what is left at teardown."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: list[str], **kw: Any) -> subprocess.Popen:
        kw.setdefault("env", child_env())
        proc = subprocess.Popen(argv, **kw)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.kill()
                except ProcessLookupError:
                    pass
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


@pytest.fixture
def procs():
    p = Procs()
    yield p
    p.close()


def free_port() -> int:
    """A port for a process to bind later: outside the ephemeral range, where no port-0 bind or
    outgoing connection of another process takes it in between (extractor/sglang/ports.py)."""
    return free_stable_port()


def get_json(url: str, timeout: float = 10.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def post_json(url: str, body: Any, token: str | None = None, timeout: float = 10.0) -> tuple[int, Any]:
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


class Daemon:
    """A real `hsmon daemon` subprocess on a free port."""

    def __init__(self, procs: Procs, tmp: Path, args: list[str], env: dict[str, str] | None = None,
                 host: str = "127.0.0.1", cwd: str | None = None, **popen: Any) -> None:
        self.stderr_path = tmp / f"daemon-{time.monotonic_ns()}.err"
        self.stderr = open(self.stderr_path, "wb")  # noqa: SIM115
        try:
            self.proc, self.url = daemon_process.spawn(
                args,
                tmp / f"port-{time.monotonic_ns()}",
                timeout=20,
                host=host,
                stderr=self.stderr,
                env=env or child_env(),
                cwd=cwd,
                **popen,
            )
        except daemon_process.DaemonStartError as exc:
            raise AssertionError(f"{exc}: {self.stderr_path.read_text()}") from exc
        procs.procs.append(self.proc)

    def status(self) -> dict[str, Any]:
        return get_json(self.url + "/api/v1/status")

    def job(self, name: str | None = None) -> dict[str, Any]:
        jobs = self.status()["jobs"]
        return jobs[0] if name is None else next(j for j in jobs if j["job"] == name)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=15)
        self.stderr.close()


class WebhookReceiver:
    """A real HTTP server on loopback that records the JSON bodies POSTed to it."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        received = self.bodies

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                received.append(json.loads(self.rfile.read(length)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

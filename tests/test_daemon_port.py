"""The control port against idle, slow and malformed clients: a real daemon, real sockets."""

from __future__ import annotations

import contextlib
import json
import resource
import socket
import subprocess
import sys
import time

import pytest
from daemon_helpers import STORY, Daemon, Procs, child_env, post_json, wait_until

TOKEN = "0123456789abcdef-port-token"
CLIENT_TIMEOUT = 3.0  # --client-timeout: idle connections closed after it, requests read within it


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    base = tmp_path_factory.mktemp("port")
    token = base / "token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    procs = Procs()
    yield Daemon(procs, base, ["--out", str(base), "--control-token-file", str(token),
                               "--client-timeout", str(CLIENT_TIMEOUT)])
    procs.close()


def address(daemon: Daemon) -> tuple[str, int]:
    host, port = daemon.url.removeprefix("http://").split(":")
    return host, int(port)


def threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return int(next(line for line in fh if line.startswith("Threads:")).split()[1])


def exchange(daemon: Daemon, raw: bytes) -> bytes:
    """Send raw bytes on one connection; everything the daemon answers until it closes it."""
    with socket.create_connection(address(daemon), timeout=10) as sock:
        sock.sendall(raw)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_idle_and_slow_clients_hold_no_thread_and_are_closed(daemon):
    before = threads(daemon.proc.pid)
    socks = [socket.create_connection(address(daemon), timeout=10) for _ in range(300)]
    for sock in socks[::3]:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # a head that never ends
    opened = time.monotonic()
    try:
        started = time.monotonic()
        with socket.create_connection(address(daemon), timeout=10) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        assert time.monotonic() - started < 3.0
        assert threads(daemon.proc.pid) <= before + 4, (before, threads(daemon.proc.pid))  # not 300 more
        for sock in socks:  # each is closed by the daemon: EOF, within the timeout and a sweep
            sock.settimeout(CLIENT_TIMEOUT + 10)
            assert sock.recv(4096) == b""
        assert time.monotonic() - opened < CLIENT_TIMEOUT + 10
    finally:
        for sock in socks:
            sock.close()


def test_a_refused_body_is_never_read_as_the_next_request(daemon):
    """A refused POST whose body is itself a request, then a real one, on one connection: two
    answers (401, then the status), the body never served."""
    smuggled = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
    refused = (b"POST /api/v1/train HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(smuggled), smuggled))
    reply = exchange(daemon, refused + b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 401") and reply.count(b"HTTP/1.1 ") == 2, reply
    assert reply.endswith(b"ok\n"), reply
    assert "/smuggled" not in daemon.stderr_path.read_text()


@pytest.mark.parametrize("length", [b"+5", b"1_0", b"5, 5", b"0x5"])
def test_a_content_length_that_is_not_plain_digits_is_refused_once(daemon, length):
    """Content-Length is parsed once (digits only): `+5` and `1_0`, which int() also takes, are
    refused with 400 and the connection closed, never read as a length by one part and not by another
    (before: the reader saw no body, the handler read 5 bytes of the next request as the body)."""
    smuggled = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
    head = (b"POST /api/v1/train HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
            b"Content-Length: %s\r\n\r\n" % (TOKEN.encode(), length))
    reply = exchange(daemon, head + b"{}   " + smuggled)
    assert reply.startswith(b"HTTP/1.1 400") and reply.count(b"HTTP/1.1 ") == 1, reply
    assert b"in digits" in reply and "/smuggled" not in daemon.stderr_path.read_text()


def test_a_chunked_body_is_refused_with_411(daemon):
    body = b'{"data_dir": "/x"}'
    head = b"POST /api/v1/train HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n" % TOKEN.encode()
    chunked = b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    reply = exchange(daemon, head + chunked)
    assert reply.startswith(b"HTTP/1.1 411") and b"Content-Length" in reply, reply


@pytest.mark.parametrize(("field", "value"), [("lr", float("nan")), ("time_limit", float("inf")),
                                              ("lr", "nan"), ("time_limit", "inf")])
def test_non_finite_numbers_are_refused(daemon, field, value):
    code, reply = post_json(daemon.url + "/api/v1/train", {field: value}, token=TOKEN)
    assert code == 400 and "must be a finite number" in reply["errors"][field], reply


def test_a_short_token_from_the_environment_is_refused(tmp_path):
    res = subprocess.run([sys.executable, "-m", "hsmon", "daemon", "--out", str(tmp_path)], timeout=60,
                         env=child_env(HSMON_CONTROL_TOKEN="short"), capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.strip() == (
        "hsmon daemon: HSMON_CONTROL_TOKEN: the token must be at least 16 characters; give a longer one")


def test_keep_alive_serves_request_after_request_without_a_nagle_wait(daemon):
    """Kept-alive requests answer at once: the answer's head and body, two writes, are not held
    for the client's delayed ACK (40 ms each, what a Prometheus scrape paid before)."""
    took = []
    with socket.create_connection(address(daemon), timeout=10) as sock:
        for _ in range(21):
            started = time.monotonic()
            sock.sendall(b"GET /api/v1/status HTTP/1.1\r\nHost: x\r\n\r\n")
            head = b""
            while b"\r\n\r\n" not in head:
                head += sock.recv(1)
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            body = b""
            while len(body) < length:
                body += sock.recv(length - len(body))
            took.append(time.monotonic() - started)
            assert json.loads(body)["jobs"]
    assert sorted(took)[10] < 0.025, took


def test_a_flood_of_idle_connections_never_leaves_the_daemon_deaf_nor_blind(tmp_path):
    """Under `ulimit -n 256`, 1,100 idle connections: /healthz answers within 3 s each time, and the
    watched job (a real running extraction) never reads unknown: the connections are capped below
    the descriptor limit with a reserve for the trackers (before: accept failed with EMFILE, the
    daemon answered nothing, and trackers that open files failed)."""
    procs = Procs()
    try:
        paths = {"--out": str(tmp_path / "out"), "--events": str(tmp_path / "events.jsonl")}
        job = procs.start([sys.executable, STORY, str(tmp_path / "dump"), paths["--out"], "--delay", "0.05",
                           "--events", paths["--events"], "--manifest"], stdout=subprocess.DEVNULL)
        watch = [*(w for pair in paths.items() for w in pair), "--dump-dir", str(tmp_path / "dump"),
                 "--pid", str(job.pid), "--scan-interval", "0.5"]
        daemon = Daemon(procs, tmp_path, watch,
                        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256)))
        wait_until(lambda: daemon.job()["state"] == "running", 30, what="the job running")
        idle: list[socket.socket] = []
        states, answered = [], []
        for _ in range(11):
            idle += [socket.create_connection(address(daemon), timeout=10) for _ in range(100)]
            started = time.monotonic()
            with socket.create_connection(address(daemon), timeout=10) as sock:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                assert sock.recv(4096).startswith(b"HTTP/1.1 200")
            answered.append(time.monotonic() - started)
            doc = daemon.job()
            states.append((doc["state"], [b["tracker"] for b in doc.get("blind") or []]))
        assert len(idle) == 1100 and max(answered) < 3.0, answered
        assert all(state != "unknown" and not blind for state, blind in states), states
        log = daemon.stderr_path.read_text()
        assert "up to 160 connections" in log and "Too many open files" not in log, log[-2000:]
    finally:
        for sock in locals().get("idle", []):
            with contextlib.suppress(OSError):
                sock.close()
        procs.close()

"""Answers are written whole over a slow link, to a slow reader.

The daemon runs in a network namespace this test makes (ip netns, a veth pair), behind a link slowed
by the kernel's own traffic control on the daemon's side: netem (delay and rate) where the kernel
has it, else a token bucket (tbf: rate and queueing latency), which this machine's kernel
(no CONFIG_NET_SCH_NETEM) is left with. A 4 MB status document (a job whose last events carry
large fields) is read by a client that takes 64 KiB every 20 ms: it arrives whole, and /healthz
answers meanwhile. Before, the handler wrote with one raw send() and dropped what the socket
buffer did not take. Needs root (as make test and CI run)."""

from __future__ import annotations

import ctypes
import json
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from daemon_helpers import Daemon, Procs, wait_until

from hsmon.contracts import events as ev

CLONE_NEWNET = 0x40000000


def ip(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *argv], capture_output=True, text=True, timeout=30, check=check)


@pytest.fixture
def slow_namespace():
    """(namespace name, the daemon's address, the qdisc used): a veth pair into a fresh namespace,
    10.231.N.2 inside, its egress slowed."""
    n = os.getpid() % 250 + 1
    name, host, inside = f"hsmon-slow-{os.getpid()}", f"hsv{os.getpid()}h"[:15], f"hsv{os.getpid()}n"[:15]
    ip("netns", "add", name)
    try:
        ip("link", "add", host, "type", "veth", "peer", "name", inside)
        ip("link", "set", inside, "netns", name)
        ip("addr", "add", f"10.231.{n}.1/30", "dev", host)
        ip("link", "set", host, "up")
        for cmd in (("addr", "add", f"10.231.{n}.2/30", "dev", inside), ("link", "set", inside, "up"),
                    ("link", "set", "lo", "up")):
            ip("netns", "exec", name, "ip", *cmd)
        tc = ["ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", inside, "root"]
        qdisc = "netem"
        if subprocess.run([*tc, "netem", "delay", "20ms", "rate", "16mbit"], capture_output=True).returncode:
            qdisc = "tbf"  # this kernel has no netem: a token bucket of the same rate, 20 ms of queue
            subprocess.run([*tc, "tbf", "rate", "16mbit", "burst", "32kbit", "latency", "20ms"], check=True,
                           capture_output=True)
        yield name, f"10.231.{n}.2", qdisc
    finally:
        ip("link", "del", host, check=False)
        ip("netns", "del", name, check=False)


def enter(namespace: str) -> None:
    """In the daemon's child, before exec: join the test's network namespace."""
    fd = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns")


def big_job(where: Path) -> Path:
    """An events file whose last 20 events carry 220 KB each: a status document of about 4.4 MB."""
    events = where / "events.jsonl"
    lines = [ev.encode_event(ev.make_event(ev.START, "big"))]
    big = "x" * 220_000
    lines += [ev.encode_event(ev.make_event("heartbeat", "big", note=f"{i:04d}{big}")) for i in range(20)]
    events.write_text("".join(lines))
    return events


def slow_read(address: tuple[str, int], path: str) -> tuple[int, bytes]:
    """GET ``path``, taking 64 KiB every 20 ms; (Content-Length, the body as far as it came)."""
    with socket.create_connection(address, timeout=30) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(64 * 1024):
            data += chunk
            time.sleep(0.02)
    head, _, body = data.partition(b"\r\n\r\n")
    fields = dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:])
    length = int(next(v for k, v in fields.items() if k.lower() == b"content-length"))
    return length, body


def test_a_4_mb_answer_reaches_a_slow_reader_over_a_slow_link_whole(slow_namespace, tmp_path):
    namespace, host, qdisc = slow_namespace
    events = big_job(tmp_path)
    procs = Procs()
    try:
        daemon = Daemon(procs, tmp_path, ["--events", str(events), "--scan-interval", "0.5"], host=host,
                        preexec_fn=lambda: enter(namespace))
        address = (host, int(daemon.url.rsplit(":", 1)[1]))
        wait_until(lambda: len(daemon.job()["recent_events"]) >= 20, 30, what="the events read")
        started = time.monotonic()
        results: list[tuple[int, bytes]] = []
        reader = threading.Thread(target=lambda: results.append(slow_read(address, "/api/v1/status")))
        reader.start()
        time.sleep(0.5)
        healthz = time.monotonic()
        with socket.create_connection(address, timeout=10) as sock:  # while the big answer trickles out
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        healthz_s = time.monotonic() - healthz
        reader.join(120)
        length, body = results[0]
        took = time.monotonic() - started
        print(f"{qdisc}: {length} bytes in {took:.1f} s; /healthz meanwhile in {healthz_s:.2f} s")
        assert length > 4_000_000 and len(body) == length, (length, len(body))
        doc = json.loads(body)
        assert len(doc["jobs"][0]["recent_events"]) >= 20
        assert took > 1.0 and healthz_s < 3.0  # the link and the reader were slow; the daemon was not deaf
    finally:
        procs.close()

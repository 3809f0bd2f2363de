"""A real daemon watching a real vLLM capture server and the extraction that uses it (make test-vllm):
the server found from the run's start event (its engine, model, load from vLLM's /metrics), the dump
directory's files coming and going, the daemon's own one-token checks leaving no file behind; and the
verdicts, each beside its slow-but-alive case, the slowness made by stopping real processes
(SIGSTOP): vLLM's engine stopped briefly reads busy, never hung, and stopped past --health-timeout
reads hung (its front still answering); the HTTP front stopped briefly reads busy, never down, and
stopped past --health-timeout reads down. The server is the session's (tests/conftest.py), left up."""

from __future__ import annotations

import json
import os
import random
import sys
import time
from contextlib import suppress

import psutil
import pytest
from daemon_helpers import Daemon, Procs, child_env, wait_until
from vllm_server import ROOT, VLLMServer

pytestmark = pytest.mark.vllm
HEALTH_INTERVAL = 2.0
HEALTH_TIMEOUT = 8.0
BUSY_AFTER = 1.5


@pytest.fixture(scope="module")
def rig(vllm_llama_server, tmp_path_factory):
    server = vllm_llama_server  # the session's tiny-Llama capture server (tests/conftest.py)
    work = tmp_path_factory.mktemp("vllm-server")
    model = server.model_dir
    rng = random.Random(3)
    data = work / "data.jsonl"
    data.write_text(
        "".join(
            json.dumps({"input_ids": [1] + [rng.randrange(3, 2000) for _ in range(60)]}) + "\n"
            for _ in range(40)
        )
    )
    procs = Procs()
    events = work / "events.jsonl"
    try:
        client = procs.start(
            [
                sys.executable,
                "-m",
                "hsmon",
                "extract",
                str(data),
                "--out",
                str(work / "out"),
                "--model",
                str(model),
                "--layers",
                "2,4,5",
                "--backend",
                "vllm",
                "--url",
                server.url,
                "--concurrency",
                "2",
                "--batch-tokens",
                "300",
                "--events",
                str(events),
            ],
            env={**child_env(), "HSMON_VLLM_READ_DELAY_S": "0.3"},
            cwd=ROOT,
        )
        daemon = Daemon(
            procs,
            work,
            [
                "--job",
                "x",
                "--events",
                str(events),
                "--dump-dir",
                str(server.dump_root),
                "--server-interval",
                "1",
                "--health-interval",
                str(HEALTH_INTERVAL),
                "--health-timeout",
                str(HEALTH_TIMEOUT),
                "--busy-after",
                str(BUSY_AFTER),
            ],
            env=child_env(),
        )
        yield {"server": server, "daemon": daemon, "client": client, "work": work}
    finally:
        with suppress(psutil.Error):  # nothing left stopped (a failed test), or the server already gone
            for child in psutil.Process(server.proc.pid).children(recursive=True):
                child.resume()
        procs.close()


def server_doc(rig) -> dict:
    return next(iter(rig["daemon"].job("x").get("servers") or []), None) or {}


def watch(rig, seconds: float) -> list[tuple[str, str]]:
    seen, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        doc = server_doc(rig)
        seen.append((doc.get("state"), doc.get("detail")))
        time.sleep(0.2)
    return seen


def engine_processes(server: VLLMServer) -> list[psutil.Process]:
    """vLLM's processes under the server that run forwards (its engine core and workers): every one but
    the API server that listens on the port."""
    front = front_of(server)
    return [p for p in psutil.Process(server.proc.pid).children(recursive=True) if p.pid != front.pid]


def front_of(server: VLLMServer) -> psutil.Process:
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == server.port and conn.pid:
            return psutil.Process(conn.pid)
    raise AssertionError(f"nothing listens on {server.port}")


def test_the_extraction_its_vllm_server_load_and_dump_directory_are_watched(rig):
    server = rig["server"]
    doc = wait_until(
        lambda: (d := server_doc(rig)).get("state") == "up" and (d.get("health") or {}).get("ok") and d,
        120,
        0.2,
        what="the vLLM server up, a forward checked",
    )
    assert (
        doc["url"] == server.url and doc["info"]["engine"] == "vllm" and doc["model"] == str(server.model_dir)
    )
    assert doc["liveness_endpoint"] == "/metrics" and doc["load"]["running"] is not None
    dump = wait_until(
        lambda: (d := rig["daemon"].job("x").get("dump") or {}).get("created_total") and d,
        120,
        0.2,
        what="vLLM's files seen in the dump directory",
    )
    assert dump["exists"] and dump["path"] == str(server.dump_root)
    assert rig["client"].wait(timeout=300) == 0
    job = wait_until(lambda: (j := rig["daemon"].job("x"))["state"] == "done" and j, 60, 0.2, what="job done")
    assert job["dump"]["consumed_total"] >= 40
    time.sleep(2 * HEALTH_INTERVAL)  # the daemon's own checks go on: their files are removed as they come
    left = sorted(set(os.listdir(server.dump_root)) - {"hsmon-vllm-serve.json"})
    assert all(name.startswith("cmpl-hsmon-health-") for name in left) and len(left) <= 2, left


def test_vllms_engine_stopped_briefly_is_busy_and_past_the_timeout_hung(rig):
    server = rig["server"]
    wait_until(lambda: server_doc(rig).get("state") == "up", 60, 0.2, what="up")
    engine = engine_processes(server)
    assert engine, "no vLLM engine process"
    for proc in engine:
        proc.suspend()
    try:
        seen = watch(rig, 5.0)  # a forward held 5 s: slower than --busy-after, within --health-timeout
    finally:
        for proc in engine:
            proc.resume()
    states = {s for s, _ in seen}
    assert "busy" in states and "hung" not in states and "down" not in states, seen
    wait_until(lambda: server_doc(rig).get("state") == "up", 60, 0.2, what="up again")
    for proc in engine:
        proc.suspend()
    stopped = time.monotonic()
    try:
        hung = wait_until(lambda: (d := server_doc(rig)).get("state") == "hung" and d, 40, 0.2, what="hung")
        took = time.monotonic() - stopped
    finally:
        for proc in engine:
            proc.resume()
    assert took <= HEALTH_TIMEOUT + 2 * HEALTH_INTERVAL + 2, took
    assert hung["reachable"] is True and hung["detail"].startswith("no forward completed in "), hung
    wait_until(lambda: server_doc(rig).get("state") == "up", 60, 0.2, what="up after the engine resumed")


def test_vllms_front_stopped_briefly_is_busy_never_down_and_past_the_timeout_down(rig):
    server = rig["server"]
    wait_until(lambda: server_doc(rig).get("state") == "up", 60, 0.2, what="up")
    front = front_of(server)
    front.suspend()
    try:
        seen = watch(rig, 4.5)  # the liveness looks (3 s timeout) time out at least once
    finally:
        front.resume()
    states = {s for s, _ in seen}
    assert "busy" in states and not states & {"down", "hung"}, seen
    wait_until(lambda: server_doc(rig).get("state") == "up", 60, 0.2, what="up again")
    front.suspend()
    stopped = time.monotonic()
    try:
        down = wait_until(lambda: (d := server_doc(rig)).get("state") == "down" and d, 30, 0.2, what="down")
        took = time.monotonic() - stopped
    finally:
        front.resume()
    # --health-timeout without an answer, found by a look (3 s timeout) at most an interval (1 s) later
    assert took <= HEALTH_TIMEOUT + 3 + 1 + 1, took
    assert down["detail"].startswith("the HTTP front has not answered for "), down
    wait_until(lambda: server_doc(rig).get("state") == "up", 60, 0.2, what="up after the long stop")

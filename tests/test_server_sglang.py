"""The server tracker against a REAL SGLang server on CPU (.sglang-venv, started through
`hsmon sglang-serve` by tests/sglang_server.py), through a real `hsmon daemon`: load while a
client works, a frozen scheduler (SIGSTOP) read as hung, a killed server read as down and back up
after a restart (without --enable-metrics), a URL that is not an SGLang server. One server for the
module; SGLang's own health_generate timeout is shortened to 5 s through its
SGLANG_HEALTH_CHECK_TIMEOUT. A missing .sglang-venv skips, or fails under HSMON_REQUIRE_SGLANG=1
(tests/sglang_server.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest
from daemon_helpers import TESTS, Daemon, Procs, child_env, free_port, wait_until
from sglang_server import EMBEDDED_MODEL, SGLangServer, crash, scheduler_of, start_sglang_server

SERVER_TIMEOUT = 5  # SGLANG_HEALTH_CHECK_TIMEOUT given to the server
HEALTH_INTERVAL = 2.0
HEALTH_TIMEOUT = 5.0  # the daemon's --health-timeout
# Few running requests and a load log every decode step: the queue builds and SGLang refreshes its
# running/queued gauges (it does so when it logs a batch).
LOAD_ARGS = ("--max-running-requests", "2", "--decode-log-interval", "1")

pytestmark = [pytest.mark.slow, pytest.mark.sglang]


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("server")
    procs = Procs()
    server = None
    before = os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT")
    os.environ["SGLANG_HEALTH_CHECK_TIMEOUT"] = str(SERVER_TIMEOUT)  # SGLang reads it at start
    try:
        server = start_sglang_server(EMBEDDED_MODEL, tmp, extra_args=(*LOAD_ARGS, "--enable-metrics"))
        other_port = free_port()  # a plain HTTP server: not SGLang
        procs.start([sys.executable, "-m", "http.server", str(other_port), "--bind", "127.0.0.1",
                     "--directory", str(tmp)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        other = f"http://127.0.0.1:{other_port}"
        events = tmp / "events.jsonl"
        client = procs.start([sys.executable, str(TESTS / "sglang_load_client.py"), str(events), "client",
                              server.url, other])
        daemon = Daemon(procs, tmp, ["--job", "client", "--events", str(events), "--stall-after", "4",
                                     "--server-interval", "1", "--health-interval", str(HEALTH_INTERVAL),
                                     "--health-timeout", str(HEALTH_TIMEOUT)], env=child_env())
        yield {"server": server, "daemon": daemon, "client": client, "other": other}
    finally:
        if before is None:
            os.environ.pop("SGLANG_HEALTH_CHECK_TIMEOUT", None)
        else:
            os.environ["SGLANG_HEALTH_CHECK_TIMEOUT"] = before
        if server is not None:
            for child in psutil.Process().children(recursive=True):
                if child.status() == psutil.STATUS_STOPPED:
                    child.resume()
            crash(server)
        procs.close()


def server_doc(rig, url=None):
    servers = rig["daemon"].job("client").get("servers") or []
    return next((s for s in servers if s["url"] == (url or rig["server"].url)), None)


def wait_server(rig, state, timeout, url=None):
    return wait_until(lambda: (server_doc(rig, url) or {}).get("state") == state and server_doc(rig, url),
                      timeout, 0.2, what=f"server {state}")


def test_up_from_the_start_event_and_load_rises_while_the_client_works(rig):
    srv = wait_server(rig, "up", 30)
    assert srv["metrics_enabled"] is True and srv["liveness_endpoint"] == "/metrics"
    wait_until(lambda: (server_doc(rig) or {}).get("info"), 30, what="server info")
    srv = server_doc(rig)
    assert srv["info"]["version"] and srv["model"].endswith("extractor/embedded")
    peak = {"running": 0.0, "queued": 0.0}
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and not (peak["running"] >= 1 and peak["queued"] >= 1):
        load = server_doc(rig)["load"]
        for key in peak:
            peak[key] = max(peak[key], load.get(key) or 0.0)
        time.sleep(0.3)
    assert peak["running"] >= 1 and peak["queued"] >= 1, peak
    wait_until(lambda: rig["daemon"].job("client")["state"] == "running", 30, what="client running")
    wait_until(lambda: server_doc(rig)["health"]["latency_s"], 30, what="a health_generate answered")

    def scraped_with_latency() -> str | None:
        text = urllib.request.urlopen(rig["daemon"].url + "/metrics", timeout=10).read().decode()
        return text if "hsmon_server_health_generate_seconds{" in text else None

    # the status API is live; the server families are rendered by the next tick (at most 1 s later)
    text = wait_until(scraped_with_latency, 5, 0.2, what="the latency in /metrics")
    assert f'hsmon_server_state{{job="client",server="{rig["server"].url}",state="up"}} 1.0' in text
    assert f'hsmon_server_up{{job="client",server="{rig["server"].url}"}} 1.0' in text
    assert "hsmon_server_health_generate_seconds{" in text and "hsmon_gpu_available 0.0" in text
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(), lint
    gpus = rig["daemon"].status()["gpus"]
    assert gpus["available"] is False and "GPUs are not watched" in gpus["reason"]


def test_frozen_scheduler_reads_hung_within_timeout_plus_interval_and_the_job_stalls(rig):
    wait_server(rig, "up", 30)
    scheduler = scheduler_of(rig["server"])
    frozen = time.monotonic()
    scheduler.suspend()
    try:
        srv = wait_server(rig, "hung", 30)
        took = time.monotonic() - frozen
        # the last counter movement is seen at most one look (1 s) after the stop, the first unanswered
        # check goes out at most one health interval after it: hung --health-timeout later
        assert took <= HEALTH_TIMEOUT + 2 * HEALTH_INTERVAL + 0.5, took
        assert srv["reachable"] is True  # the HTTP front still answers: hung, not down
        assert srv["detail"].startswith("no forward completed in ") and "counters frozen" in srv["detail"]
        hung = f"server {rig['server'].url} is hung: no forward completed in"
        job = wait_until(lambda: (j := rig["daemon"].job("client"))["reason"].startswith(hung) and j, 20,
                         what="job stalled, the server named")  # the next tick after the server turned
        assert job["state"] == "stalled"
        assert "server-hung" in {h["id"] for h in job["hints"]}
    finally:
        scheduler.resume()
    print(f"hung seen {took:.1f} s after SIGSTOP")
    wait_server(rig, "up", 30)
    wait_until(lambda: rig["daemon"].job("client")["state"] == "running", 30, what="client running again")


def front_of(server: SGLangServer) -> psutil.Process:
    """The SGLang process that listens on the server's port (its HTTP front, the tokenizer manager)."""
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == server.port and conn.pid:
            return psutil.Process(conn.pid)
    raise AssertionError(f"nothing listens on {server.port}")


def test_a_slow_http_front_is_busy_never_down_and_a_front_frozen_past_the_timeout_is_down(rig, tmp_path):
    """The HTTP front stopped (SIGSTOP) for 4.5 s: the daemon's liveness looks (every 1 s, 3 s
    timeout) time out at least once, as on a machine too loaded to answer in time. A daemon with
    --health-timeout 10 reads busy, never down nor hung; the front stopped for 16 s reads down
    within 10 s + a look's 3 s timeout + 1 s interval, and up once it answers again."""
    server = rig["server"]
    procs = Procs()
    try:
        args = ["--job", "front", "--server", server.url, "--server-interval", "1", "--health-interval", "2",
                "--health-timeout", "10"]  # fmt: skip
        daemon = Daemon(procs, tmp_path, args, env=child_env())

        def srv() -> dict:
            return (daemon.job("front").get("servers") or [{}])[0]

        def note() -> bool:
            seen.append((srv().get("state"), srv().get("detail")))
            return seen[-1][0] == "up"

        wait_until(lambda: srv().get("state") == "up" and srv()["health"]["latency_s"], 60, 0.2, what="up")
        front = front_of(server)
        seen: list[tuple[str | None, str | None]] = []
        front.suspend()
        try:
            deadline = time.monotonic() + 4.5
            while time.monotonic() < deadline:
                note()
                time.sleep(0.2)
        finally:
            front.resume()
        wait_until(note, 30, 0.2, what="up again")
        states = {s for s, _ in seen}
        assert "busy" in states and not states & {"down", "hung"}, seen
        assert any((d or "").startswith("the HTTP front is slow: no answer for") for _, d in seen), seen
        front.suspend()
        stopped = time.monotonic()
        try:
            down = wait_until(lambda: srv().get("state") == "down" and srv(), 16, 0.2, what="down")
            took = time.monotonic() - stopped
        finally:
            front.resume()
        assert took <= 10 + 3 + 1 + 1, took
        assert down["detail"].startswith("the HTTP front has not answered for "), down
        wait_until(lambda: srv().get("state") == "up", 30, 0.2, what="up after the long stop")
        print(f"a 4.5 s stop: {sorted(states)}; a long stop read down after {took:.1f} s")
    finally:
        procs.close()


def test_a_real_sglang_extraction_names_its_server_and_its_load_rises(rig, tmp_path):
    """`hsmon extract --backend sglang` (the real client, 8 requests in flight against a server that
    runs 2) and a daemon given no --server: the server comes from the extraction's own start event,
    is watched, and its queue rises while the extraction works. The plain client is frozen first and
    the queue seen drained, so what rises is the extraction's."""
    from extract_helpers import make_dataset, start_extract, wait_for_event

    server = rig["server"]
    events = tmp_path / "extract.jsonl"
    data = make_dataset(tmp_path / "rows.jsonl", rows=2000, seed=3)
    procs = Procs()
    client = psutil.Process(rig["client"].pid)
    client.suspend()
    try:
        wait_until(lambda: (server_doc(rig)["load"].get("queued") or 0) == 0, 60, 0.2,
                   what="the frozen client's requests drained from the queue")  # fmt: skip
        args = ("--backend", "sglang", "--url", server.url, "--transport", "json", "--max-length", "60",
                "--concurrency", "8", "--chunk-size", "50")  # fmt: skip
        err = tmp_path / "extract.err"
        with open(err, "w") as fh:
            proc = start_extract(data, tmp_path / "out", EMBEDDED_MODEL, *args, events=events, stderr=fh)
        procs.procs.append(proc)
        try:
            start = wait_for_event(events, lambda e: e["kind"] == "start", proc)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{err.read_text()[-2000:]}") from None
        assert start["urls"] == [server.url]
        daemon = Daemon(procs, tmp_path, ["--events", str(events), "--server-interval", "1",
                                          "--health-interval", str(HEALTH_INTERVAL)], env=child_env())
        watched = wait_until(lambda: daemon.job().get("servers"), 30, what="the start event's server")
        assert [s["url"] for s in watched] == [server.url]
        wait_until(lambda: daemon.job()["servers"][0]["state"] == "up", 30, what="its server up")
        peak = {"queued": 0.0, "running": 0.0, "prompt_tokens_per_s": 0.0}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if peak["queued"] >= 1 and peak["prompt_tokens_per_s"] > 0:
                break
            load = daemon.job()["servers"][0]["load"]
            for key in peak:
                peak[key] = max(peak[key], load.get(key) or 0.0)
            time.sleep(0.2)
        assert peak["queued"] >= 1 and peak["prompt_tokens_per_s"] > 0, (peak, err.read_text()[-2000:])
        # the capture plugin's counters (json = its pack mode), read from /server_info after each
        # health check that succeeded, move while the extraction works; and reach /metrics
        def capture():
            return daemon.job()["servers"][0]["capture"]

        first = wait_until(capture, 30, 0.2, what="capture counters")
        assert first["plugin_version"] == "1" and first["schedulers"] == 1 and first["pool_bytes_max"] > 0
        moved = wait_until(lambda: (c := capture())["requests"] > first["requests"] and c, 30, 0.2,
                           what="the capture counters moving")  # fmt: skip
        assert moved["read_ts"] > first["read_ts"] and moved["hook_seconds"] >= first["hook_seconds"]
        assert moved["hook_seconds_p99"] is not None and moved["hook_seconds_p99"] > 0
        assert moved["write_errors"] == 0 and moved["buffer_reuses"] == 0
        line = f'hsmon_server_capture_requests_total{{job="{daemon.job()["job"]}",server="{server.url}"}}'

        def exported():
            text = urllib.request.urlopen(daemon.url + "/metrics", timeout=10).read().decode()
            return text if line in text else None

        text = wait_until(exported, 10, 0.2, what="the capture counters in /metrics")
        assert float(text.split(line, 1)[1].split()[0]) >= first["requests"]
        job = wait_until(lambda: (j := daemon.job())["state"] in ("running", "done") and j, 30, 0.2,
                         what="the extraction's job running")  # fmt: skip
        print(f"while extracting: {peak}, job {job['state']}, {job['progress'].get('rows_done')} rows done")
        assert job["progress"]["rows_done"] > 0, job
    finally:
        client.resume()
        procs.close()


def test_killed_server_reads_down_then_up_after_a_restart_without_metrics(rig):
    server = rig["server"]
    wait_server(rig, "up", 30)
    crash(server)
    wait_server(rig, "down", 10)
    down = f"server {server.url} is down ("
    job = wait_until(lambda: (j := rig["daemon"].job("client"))["reason"].startswith(down) and j, 20,
                     what="job stalled, the down server named")
    assert job["state"] == "stalled"
    server.extra_args = LOAD_ARGS  # the same server without --enable-metrics (sglang-serve passes it)
    server.serve_args = ("--no-metrics",)
    server.start()
    srv = wait_server(rig, "up", 60)
    assert srv["connects_total"] == 2 and srv["liveness_endpoint"] == "/model_info"
    assert srv["metrics_enabled"] is False and srv["load"]["running"] is None
    wait_until(lambda: rig["daemon"].job("client")["state"] == "running", 60, what="client running again")


def test_a_url_that_is_not_sglang_reads_unknown_and_nothing_floods_the_log(rig):
    srv = server_doc(rig, rig["other"])
    assert srv["state"] == "unknown" and "not an SGLang or vLLM server" in srv["detail"]
    assert rig["daemon"].proc.poll() is None
    log = rig["daemon"].stderr_path.read_text()
    assert sum(rig["other"] in line for line in log.splitlines()) <= 2, log
    # the killed server's down was logged once, however long it stayed down (the front frozen past
    # the timeout earlier logged its own down: "the HTTP front has not answered"). Its first failed
    # check names what the kill did to it: a refused connection, or, when the kill fell on a request
    # in flight, "Remote end closed connection without response" (a clean-clone run at load 5).
    killed = [line for line in log.splitlines()
              if "hsmon.server" in line and " is down: " in line and "has not answered" not in line]
    assert len(killed) == 1, log


def test_a_server_answering_503_at_once_is_busy_while_counters_move_and_hung_when_nothing_does(rig):
    """SGLang with SGLANG_HEALTH_CHECK_TIMEOUT=0 answers every /health_generate 503 at once (a 503 that
    says nothing about a long forward). While the client's requests move its /metrics counters the
    server reads busy, never hung; with the client frozen nothing moves and it reads hung within
    --health-timeout + 2 x interval of the last movement, the reason saying what was seen."""
    server = rig["server"]
    crash(server)
    wait_server(rig, "down", 10)
    server.extra_args = (*LOAD_ARGS, "--enable-metrics")
    server.serve_args = ()
    # /health without a generation, so that `hsmon sglang-serve` still sees it ready
    server.env = {"SGLANG_HEALTH_CHECK_TIMEOUT": "0", "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0"}
    server.start()
    srv = wait_server(rig, "busy", 60)
    assert srv["health"]["sglang_timeout_s"] == 0.0, srv["health"]
    wait_until(lambda: (server_doc(rig)["health"]["failures_in_row"] or 0) >= 3, 30, 0.2, what="three 503s")
    states, deadline = [], time.monotonic() + 3 * HEALTH_TIMEOUT
    while time.monotonic() < deadline:
        srv = server_doc(rig)
        states.append((srv["state"], srv["detail"]))
        time.sleep(0.2)
    assert {s for s, _ in states} == {"busy"}, states  # the client's tokens move: busy, never hung
    assert "answered at once; SGLang's own timeout is 0 s" in states[-1][1], states[-1]
    assert any(" moved " in d for _, d in states), states
    client = psutil.Process(rig["client"].pid)
    client.suspend()
    try:
        srv = wait_server(rig, "hung", 60)
        detail = srv["detail"]
        assert detail.startswith("no forward completed in ") and "/health_generate 503 ×" in detail, detail
        assert "counters frozen" in detail, detail
        moved = srv["last_forward_ts"]
        seen = time.time()
        assert seen - moved <= HEALTH_TIMEOUT + 2 * HEALTH_INTERVAL + 1.5, (seen - moved, srv)
    finally:
        client.resume()
    wait_server(rig, "busy", 30)

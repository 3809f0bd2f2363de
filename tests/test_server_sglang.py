"""The server tracker against a REAL SGLang server on CPU (.sglang-venv), through a real
`hsmon daemon`: load while a client works, a frozen scheduler (SIGSTOP) read as hung, a killed
server read as down and back up after a restart (without --enable-metrics), a URL that is not an
SGLang server. One server for the module; SGLang's own health_generate timeout is shortened to 5 s
through its SGLANG_HEALTH_CHECK_TIMEOUT. A missing .sglang-venv skips, or fails under
HSMON_REQUIRE_SGLANG=1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from daemon_helpers import REPO, TESTS, Daemon, Procs, child_env, free_port, wait_until

SGLANG_PYTHON = REPO / ".sglang-venv" / "bin" / "python"
SERVER_TIMEOUT = 5  # SGLANG_HEALTH_CHECK_TIMEOUT given to the server
HEALTH_INTERVAL = 2.0
HEALTH_TIMEOUT = 5.0  # the daemon's --health-timeout
READY_TIMEOUT = 240

pytestmark = [pytest.mark.slow, pytest.mark.sglang]


class StockServer:
    """`python -m sglang.launch_server` on the embedded 8-layer target, in its own process group."""

    def __init__(self, workdir: Path, port: int) -> None:
        self.workdir, self.port = workdir, port
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, metrics: bool = True) -> None:
        self.starts += 1
        log = self.workdir / f"sglang-{self.starts}.log"
        model = str(REPO / "extractor" / "embedded")
        argv = [str(SGLANG_PYTHON), "-m", "sglang.launch_server", "--model-path", model,
                "--device", "cpu", "--host", "127.0.0.1", "--port", str(self.port),
                "--attention-backend", "torch_native", "--dtype", "float32", "--max-total-tokens", "4096",
                "--disable-radix-cache", "--max-running-requests", "2", "--decode-log-interval", "1"]
        if metrics:
            argv.append("--enable-metrics")
        env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "PYTHONPATH": str(TESTS / "sglang_stubs"),
               "SGLANG_HEALTH_CHECK_TIMEOUT": str(SERVER_TIMEOUT), "OMP_NUM_THREADS": "1"}
        with open(log, "wb") as fh:
            self.proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        deadline = time.monotonic() + READY_TIMEOUT
        while "The server is fired up" not in log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"SGLang did not start:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.5)

    def scheduler(self) -> psutil.Process:
        assert self.proc is not None
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            if (child.cmdline() or [""])[0].startswith("sglang::scheduler"):
                return child
        raise AssertionError("no sglang::scheduler child")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                child.resume()
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    if not SGLANG_PYTHON.exists():
        if os.environ.get("HSMON_REQUIRE_SGLANG"):
            raise AssertionError(f"{SGLANG_PYTHON} missing: run `make sglang-env`")
        pytest.skip("no .sglang-venv (make sglang-env builds it)")
    tmp = tmp_path_factory.mktemp("server")
    procs = Procs()
    server = StockServer(tmp, free_port())
    try:
        server.start()
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
        server.kill()
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
    text = urllib.request.urlopen(rig["daemon"].url + "/metrics", timeout=10).read().decode()
    assert f'hsmon_server_state{{job="client",server="{rig["server"].url}",state="up"}} 1.0' in text
    assert f'hsmon_server_up{{job="client",server="{rig["server"].url}"}} 1.0' in text
    assert "hsmon_server_health_generate_seconds{" in text and "hsmon_gpu_available 0.0" in text
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(), lint
    gpus = rig["daemon"].status()["gpus"]
    assert gpus["available"] is False and "GPUs are not watched" in gpus["reason"]


def test_frozen_scheduler_reads_hung_within_timeout_plus_interval_and_the_job_stalls(rig):
    wait_server(rig, "up", 30)
    scheduler = rig["server"].scheduler()
    frozen = time.monotonic()
    scheduler.suspend()
    try:
        wait_server(rig, "hung", 30)
        took = time.monotonic() - frozen
        assert took <= HEALTH_TIMEOUT + HEALTH_INTERVAL + 0.5, took
        srv = server_doc(rig)
        assert srv["reachable"] is True  # the HTTP front still answers: hung, not down
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


def test_killed_server_reads_down_then_up_after_a_restart_without_metrics(rig):
    server = rig["server"]
    wait_server(rig, "up", 30)
    server.kill()
    wait_server(rig, "down", 10)
    down = f"server {server.url} is down ("
    job = wait_until(lambda: (j := rig["daemon"].job("client"))["reason"].startswith(down) and j, 20,
                     what="job stalled, the down server named")
    assert job["state"] == "stalled"
    server.start(metrics=False)
    srv = wait_server(rig, "up", 60)
    assert srv["connects_total"] == 2 and srv["liveness_endpoint"] == "/model_info"
    assert srv["metrics_enabled"] is False and srv["load"]["running"] is None
    wait_until(lambda: rig["daemon"].job("client")["state"] == "running", 60, what="client running again")


def test_a_url_that_is_not_sglang_reads_unknown_and_nothing_floods_the_log(rig):
    srv = server_doc(rig, rig["other"])
    assert srv["state"] == "unknown" and "not an SGLang server" in srv["detail"]
    assert rig["daemon"].proc.poll() is None
    log = rig["daemon"].stderr_path.read_text()
    assert sum(rig["other"] in line for line in log.splitlines()) <= 2, log
    assert sum(" is down" in line for line in log.splitlines() if "hsmon.server" in line) == 1, log

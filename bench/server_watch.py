"""Benchmark: what watching inference servers and GPUs costs the daemon.

A daemon (hsmon's Monitor and HTTP server, in a child process) watches one job (events file and a
process) plus 4 recorded SGLang servers and 8 recorded GPUs, with the default intervals (liveness
every 5 s, /health_generate every 15 s, GPUs every 5 s); then the same job without servers or GPUs,
as before this feature. Recorded servers: a child process replays, on 4 ports, what a real SGLang
0.5.23 answered (tests/fixtures/sglang_recording/; /health_generate answers 200 after 1 s, as SGLang
does). Recorded GPUs: tests/fixtures/nvml_recording.json through the pynvml calls the tracker makes.
Printed: the daemon's CPU (% of one core, and seconds per hour of watching) and its /metrics scrape
time, with and without, and the monitor tick's duration (the engine families are rendered by the tick,
so that a scrape copies bytes: hsmon.metrics.engine_metrics). Goals: CPU <= 1 % of a core, scrape time
unchanged within noise.

    python bench/server_watch.py [--seconds 60] [--scrapes 200]
Ends with: RESULT cpu_pct=... scrape_ms=... scrape_ms_without=... cpu_pct_without=... scrape_ratio=...
tick_ms=... tick_ms_without=...
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
RECORDING = REPO / "tests" / "fixtures" / "sglang_recording"


def serve_recorded(count: int) -> None:
    """Child: replay a recorded SGLang server on ``count`` free ports; print the ports, then serve."""
    answers = {
        "/metrics": (RECORDING / "metrics.txt").read_bytes(),
        "/model_info": (RECORDING / "model_info.json").read_bytes(),
        "/server_info": (RECORDING / "server_info.json").read_bytes(),
        "/v1/models": (RECORDING / "v1_models.json").read_bytes(),
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/health_generate":
                time.sleep(1.0)  # SGLang checks for the forward once a second
                body = b""
            elif self.path in answers:
                body = answers[self.path]
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    servers = [ThreadingHTTPServer(("127.0.0.1", 0), Handler) for _ in range(count)]
    for srv in servers:
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    print(json.dumps([s.server_address[1] for s in servers]), flush=True)
    sys.stdin.read()  # until the parent closes our stdin


def run_daemon(with_engine: bool, ports: list[int], events: str, pid: int) -> None:
    """Child: the daemon's Monitor and HTTP server; prints its URL, serves until stdin closes."""
    sys.path.insert(0, str(REPO / "tests"))
    from nvml_recording import RecordedNvml

    from hsmon.core.config import JobConfig
    from hsmon.core.monitor import Monitor
    from hsmon.core.trackers.gpu import GpuTracker
    from hsmon.daemon.api import DaemonServer
    from hsmon.metrics.exporter import MetricsEndpoint

    job = JobConfig(name="extract", events=events, pid=pid, stall_after=300)
    if with_engine:
        job.servers = [job.server_spec(f"http://127.0.0.1:{p}") for p in ports]
        gpu = GpuTracker(nvml=RecordedNvml())
    else:
        gpu = GpuTracker(nvml=RecordedNvml(init_error="Driver Not Loaded"))  # as on a machine without GPUs
    monitor = Monitor([job], use_watchdog=True, gpu=gpu)
    server = DaemonServer(("127.0.0.1", 0), monitor, MetricsEndpoint(monitor), None)
    monitor.start()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    sys.stdin.read()
    monitor.stop()


def tick_ms(body: bytes) -> float:
    """The daemon's last tick duration (ms) from a /metrics body."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(body.decode()):
        if family.name == "hsmon_tick_duration_seconds":
            return family.samples[0].value * 1000
    raise AssertionError("no hsmon_tick_duration_seconds in /metrics")


def measure(
    with_engine: bool, ports: list[int], events: str, seconds: float, scrapes: int
) -> tuple[float, float, float]:
    """(daemon CPU % of a core over ``seconds`` of idle watching, median scrape ms, median tick ms)."""
    mode = "with" if with_engine else "without"
    child = subprocess.Popen(
        [sys.executable, __file__, "--daemon", mode, "--ports", json.dumps(ports), "--events", events,
         "--pid", str(_sleeper.pid)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        url = child.stdout.readline().strip()
        time.sleep(min(20.0, seconds / 3))  # first connects, first health_generate, NVML init
        proc = psutil.Process(child.pid)
        cpu0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
        time.sleep(seconds)
        cpu1, t1 = sum(proc.cpu_times()[:2]), time.monotonic()
        cpu_pct = 100.0 * (cpu1 - cpu0) / (t1 - t0)
        times, ticks = [], []
        for _ in range(scrapes):
            start = time.perf_counter()
            with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
                body = resp.read()
            times.append((time.perf_counter() - start) * 1000)
            ticks.append(tick_ms(body))
        if with_engine:
            doc = json.loads(urllib.request.urlopen(url + "/api/v1/status", timeout=10).read())
            states = [s["state"] for s in doc["jobs"][0]["servers"]]
            print(f"  {mode}: servers {states}, GPUs {len(doc['gpus']['devices'])}, "
                  f"/metrics {len(body)} bytes")
        return cpu_pct, statistics.median(times), statistics.median(ticks)
    finally:
        child.stdin.close()
        child.wait(timeout=30)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--scrapes", type=int, default=200)
    p.add_argument("--serve-recorded", type=int, help=argparse.SUPPRESS)
    p.add_argument("--daemon", choices=("with", "without"), help=argparse.SUPPRESS)
    p.add_argument("--ports", help=argparse.SUPPRESS)
    p.add_argument("--events", help=argparse.SUPPRESS)
    p.add_argument("--pid", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve_recorded:
        serve_recorded(a.serve_recorded)
        return
    if a.daemon:
        run_daemon(a.daemon == "with", json.loads(a.ports), a.events, a.pid)
        return

    global _sleeper
    _sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    recorded = subprocess.Popen([sys.executable, __file__, "--serve-recorded", "4"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
    try:
        ports = json.loads(recorded.stdout.readline())
        with tempfile.TemporaryDirectory(prefix="hsmon-bench-") as tmp:
            events = str(Path(tmp) / "events.jsonl")
            Path(events).write_text(json.dumps({"v": 1, "ts": time.time(), "job": "extract", "kind": "start",
                                                "pid": _sleeper.pid, "rows_total": 10}) + "\n")
            print(f"watching 4 recorded servers (ports {ports}) and 8 recorded GPUs for {a.seconds:.0f} s, "
                  "then none")
            cpu_with, scrape_with, tick_with = measure(True, ports, events, a.seconds, a.scrapes)
            cpu_without, scrape_without, tick_without = measure(False, ports, events, a.seconds, a.scrapes)
    finally:
        recorded.stdin.close()
        recorded.wait(timeout=30)
        _sleeper.kill()
    load = psutil.getloadavg()
    print(f"daemon CPU with 4 servers + 8 GPUs: {cpu_with:.2f} % of a core "
          f"({cpu_with * 36:.0f} CPU s per hour); without: {cpu_without:.2f} % ({cpu_without * 36:.0f} s/h)")
    print(f"/metrics scrape: {scrape_with:.2f} ms with, {scrape_without:.2f} ms without "
          f"(ratio {scrape_with / scrape_without:.2f}); "
          f"load average {load[0]:.1f} on {psutil.cpu_count()} CPUs")
    print(f"monitor tick (the engine families render there): {tick_with:.2f} ms with, "
          f"{tick_without:.2f} ms without, once a second")
    print(f"RESULT cpu_pct={cpu_with:.2f} scrape_ms={scrape_with:.2f} scrape_ms_without={scrape_without:.2f} "
          f"cpu_pct_without={cpu_without:.2f} scrape_ratio={scrape_with / scrape_without:.2f} "
          f"tick_ms={tick_with:.2f} tick_ms_without={tick_without:.2f}")


_sleeper: subprocess.Popen[bytes]

if __name__ == "__main__":
    main()

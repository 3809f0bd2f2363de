"""Benchmark: the daemon watching a dump directory through a file storm.

Two writer processes create and delete files in a tmpfs dump directory as fast as they can while a
real `hsmon daemon` watches it. Printed:
- the daemon's CPU seconds per 10,000 files created,
- the count error once the storm settles (daemon's files/bytes vs a listing; goal 0),
- detection latency p50/p99 of a new file at a moderate rate (create -> visible in /api/v1/status),
- /metrics scrape time with 1,000 and 100,000 files present, against a naive exporter that lists
  the directory on each scrape (goal: <= 5 ms and flat in the number of files).

    python bench/watch_storm.py [--files 100000] [--dir /dev/shm]
Ends with: RESULT files=... cpu_s_per_10k=... count_error=... latency_p50_ms=... latency_p99_ms=...
           scrape_ms=... naive_scrape_ms=...
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil

from hsmon import daemon as daemon_process

REPO = Path(__file__).resolve().parent.parent

WRITER = """
import os, sys
d, tag, n, window = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
payload = b"x" * 64
for i in range(n):
    fd = os.open(f"{d}/{tag}_{i}", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, payload)
    os.close(fd)
    if i >= window:
        os.unlink(f"{d}/{tag}_{i - window}")
"""


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.read()


def dump_status(base: str) -> dict:
    return json.loads(get(base + "/api/v1/status"))["jobs"][0]["dump"]


def listing(d: str) -> tuple[int, int]:
    files = nbytes = 0
    with os.scandir(d) as it:
        for entry in it:
            files += 1
            nbytes += entry.stat().st_size
    return files, nbytes


def fs_events_handled(base: str) -> float:
    for line in get(base + "/metrics").decode().splitlines():
        if line.startswith("hsmon_dump_fs_events_total"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def settle_events(base: str, quiet_s: float = 1.0, limit_s: float = 60.0) -> None:
    """Wait until the daemon has handled the queued filesystem events (its counter stops moving)."""
    deadline = time.monotonic() + limit_s
    last = fs_events_handled(base)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = fs_events_handled(base)
        if now == last:
            return
        last = now


def time_scrapes(url: str, n: int = 30) -> float:
    get(url)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        get(url)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def naive_exporter(d: str) -> ThreadingHTTPServer:
    """What a simple exporter does: list the directory on every scrape."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import GaugeMetricFamily

    class Naive:
        def collect(self):
            now = time.time()
            files = nbytes = 0
            oldest = now
            with os.scandir(d) as it:
                for entry in it:
                    try:
                        st = entry.stat()
                    except OSError:
                        continue
                    files += 1
                    nbytes += st.st_size
                    oldest = min(oldest, st.st_mtime)
            for name, value in (
                ("naive_dump_files", files),
                ("naive_dump_bytes", nbytes),
                ("naive_dump_oldest_file_age_seconds", now - oldest),
            ):
                g = GaugeMetricFamily(name, name)
                g.add_metric([], value)
                yield g

    registry = CollectorRegistry()
    registry.register(Naive())

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def fill(d: str, start: int, count: int) -> None:
    for i in range(start, start + count):
        with open(f"{d}/still_{i}", "wb") as fh:
            fh.write(b"y" * 32)


@dataclass
class StormFigures:
    """The storm step's figures."""

    files: int
    cpu_s: float
    count_error: int


def start_daemon(root: str, dump: str, scan_interval: float) -> tuple[subprocess.Popen[bytes], str]:
    """A real daemon watching ``dump`` alone; its process and base URL."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    try:
        return daemon_process.spawn(
            [
                "--job", "storm",
                "--dump-dir", dump,
                "--stall-after", "3600",
                "--scan-interval", str(scan_interval),
                "--log-level", "WARNING",
            ],
            os.path.join(root, "port"),
            env=env,
            stderr=open(os.path.join(root, "daemon.err"), "wb"),
        )  # fmt: skip
    except daemon_process.DaemonStartError as exc:
        raise SystemExit(f"bench: {exc}: {Path(root, 'daemon.err').read_text()}") from exc


def storm(ps: psutil.Process, base: str, dump: str, total: int, scan_interval: float) -> StormFigures:
    """Two writers create (and delete) ``total`` files; the daemon's CPU and its count error after."""
    per_writer = total // 2
    cpu0 = sum(ps.cpu_times()[:2])
    t0 = time.perf_counter()
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, dump, tag, str(per_writer), "500"])
        for tag in ("a", "b")
    ]
    for w in writers:
        w.wait()
    storm_s = time.perf_counter() - t0
    files = per_writer * 2
    # settle: two scan intervals cover a scan that started mid-storm and a full one after it
    time.sleep(2 * scan_interval + 0.5)
    cpu_s = sum(ps.cpu_times()[:2]) - cpu0
    true_files, true_bytes = listing(dump)
    seen = dump_status(base)
    count_error = abs(seen["files"] - true_files) + abs(seen["bytes"] - true_bytes)
    overflows = json.loads(get(base + "/api/v1/status"))["daemon"]["overflows_total"]
    print(
        f"storm: {files} files created and {files - true_files} deleted by 2 writers in {storm_s:.1f}s "
        f"({files / storm_s:.0f} files/s)"
    )
    print(
        f"daemon CPU during storm+settle: {cpu_s:.2f}s = {cpu_s / files * 10000:.3f}s per 10k files; "
        f"inotify overflows: {overflows}"
    )
    print(
        f"after settling: daemon files={seen['files']} bytes={seen['bytes']}, listing files={true_files} "
        f"bytes={true_bytes}: count error {count_error}"
    )
    print(
        f"events seen: created_total={seen['created_total']} of {files} creates "
        f"({100 * seen['created_total'] / files:.0f} %; files created and deleted between two looks are "
        "invisible to any scan)"
    )
    return StormFigures(files, cpu_s, count_error)


def detection_latencies(base: str, dump: str, scan_interval: float) -> list[float]:
    """Milliseconds from a new file's creation to the daemon's count, 200 files at ~40 files/s, sorted."""
    shutil.rmtree(dump)
    os.mkdir(dump)
    time.sleep(2 * scan_interval + 0.5)
    latencies = []
    start = dump_status(base)["created_total"]
    for i in range(200):
        with open(f"{dump}/lat_{i}", "wb") as fh:
            fh.write(b"z")
        t = time.perf_counter()
        while dump_status(base)["created_total"] < start + i + 1:
            if time.perf_counter() - t > 10:
                break
        latencies.append((time.perf_counter() - t) * 1000)
        time.sleep(0.02)
    return sorted(latencies)


def scrape_times(base: str, dump: str, naive_url: str, present: int) -> dict[int, tuple[float, float]]:
    """/metrics time (hsmon, naive) with 1,000 and 100,000 files present."""
    results = {}
    for target in (1_000, 100_000):
        fill(dump, present, target - present)
        present = target
        t = time.perf_counter()
        while dump_status(base)["files"] != target and time.perf_counter() - t < 60:
            time.sleep(0.2)
        settle_events(base)
        results[target] = (time_scrapes(base + "/metrics"), time_scrapes(naive_url, 10))
        print(
            f"/metrics with {target:>7} files: hsmon {results[target][0]:.2f} ms, "
            f"naive (lists the directory) {results[target][1]:.2f} ms"
        )
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--files", type=int, default=100_000, help="files created by the storm (both writers)"
    )
    parser.add_argument("--dir", default="/dev/shm", help="a tmpfs to make the dump directory in")
    parser.add_argument("--scan-interval", type=float, default=2.0)
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix="hsmon-storm-", dir=args.dir)
    dump = os.path.join(root, "dump")
    os.mkdir(dump)
    daemon, base = start_daemon(root, dump, args.scan_interval)
    naive = None
    try:
        ps = psutil.Process(daemon.pid)
        time.sleep(1.0)
        figures = storm(ps, base, dump, args.files, args.scan_interval)
        latencies = detection_latencies(base, dump, args.scan_interval)
        p50 = latencies[len(latencies) // 2]
        p99 = latencies[int(len(latencies) * 0.99) - 1]
        print(
            f"detection latency of a new file at ~40 files/s: p50 {p50:.2f} ms, p99 {p99:.2f} ms "
            f"(scan-only would be up to {args.scan_interval * 1000:.0f} ms)"
        )
        naive = naive_exporter(dump)
        naive_url = f"http://127.0.0.1:{naive.server_address[1]}/metrics"
        results = scrape_times(base, dump, naive_url, len(latencies))
        scrape_ms, naive_ms = results[100_000]
        print(
            f"scrape ratio naive/hsmon at 100k files: {naive_ms / scrape_ms:.0f}x; hsmon 100k vs 1k: "
            f"{scrape_ms / results[1_000][0]:.2f}x"
        )
        print(
            f"RESULT files={figures.files} cpu_s_per_10k={figures.cpu_s / figures.files * 10000:.3f} "
            f"count_error={figures.count_error} latency_p50_ms={p50:.2f} latency_p99_ms={p99:.2f} "
            f"scrape_ms={scrape_ms:.2f} naive_scrape_ms={naive_ms:.2f}"
        )
        return 0
    finally:
        if naive is not None:
            naive.shutdown()
        daemon.terminate()
        try:
            daemon.wait(timeout=15)
        except subprocess.TimeoutExpired:
            daemon.kill()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())

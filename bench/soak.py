"""Benchmark: a week of service compressed into ``--minutes`` (issue 33 item 2).

A real `hsmon daemon` (hsmon.daemon.spawn), a real Prometheus (Debian's `prometheus`) scraping it
every second with the shipped alert rules (dashboards/prometheus/hsmon-alerts.yml), and with
``--tui`` a real `hsmon tui` in tmux. Jobs start and finish all along (up to 20 at once): each is a
writer process of contract-1 events (start with its row and token plan, cumulative `rows` events,
done) at 20x the story's row rate, and is added/removed by a reload (SIGHUP with a rewritten
hsmon.toml). Injected at known times: a writer frozen (SIGSTOP) past stall_after, a writer killed
(SIGKILL). Events files are rotated both ways by their writers (rename + create, copytruncate).

Synthetic parts: the writers (no model, no GPU: rows are sleeps whose length follows the row's
token count, 200-4000 tokens, ~10,500 tokens/s +-30 % noise, i.e. ~5 rows/s a job = 20x an assumed
story rate of 0.25 rows/s); no contract-2 manifests, dump-dir churn or filled tmpfs (not done yet).

Every 10 s: daemon RSS, fds, threads, CPU, /metrics scrape time and series; every 1 s:
Prometheus's firing alerts and the daemon's status (ETA at 5/25/50 % of each job's rows).

    python bench/soak.py [--minutes 60] [--tui]
Ends with: RESULT rss_slope_mb_h=... false_alerts=... fault_alerts_missed=... series_growth=...
           scrape_ms_p99=... eta_error_pct=... reload_s=...
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import yaml

from hsmon import daemon as daemon_process

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "dashboards" / "prometheus" / "hsmon-alerts.yml"
STALL_AFTER = 15.0
GRACE = 15.0
MAX_JOBS = 20
TOKENS_PER_S = 10_500.0

WRITER = r"""
import json, os, random, shutil, sys, time
path, job, rows, seed, rot = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
rng = random.Random(seed)
lengths = [rng.randint(200, 4000) for _ in range(rows)]
f = open(path, "a")
def emit(kind, **kw):
    f.write(json.dumps({"v": 1, "ts": time.time(), "job": job, "kind": kind, **kw}) + "\n"); f.flush()
emit("start", pid=os.getpid(), rows_total=rows, tokens_total=sum(lengths))
done = tokens = 0
for i, n in enumerate(lengths):
    time.sleep(n / RATE * rng.uniform(0.7, 1.3))
    done, tokens = done + 1, tokens + n
    emit("rows", rows=1, tokens=n, rows_done=done, tokens_done=tokens)
    if i == rows // 2 and rot == "rename":
        f.close(); os.rename(path, path + ".1"); f = open(path, "a")
    elif i == rows // 2 and rot == "copytruncate":
        shutil.copy(path, path + ".1"); os.truncate(path, 0)
emit("done", rows_done=done, tokens_done=tokens)
""".replace("RATE", repr(TOKENS_PER_S))


@dataclass
class Job:
    name: str
    proc: subprocess.Popen[bytes]
    events: Path
    pidfile: Path
    rows: int
    fault: str | None = None
    fault_ts: float | None = None
    alert: tuple[str, float] | None = None  # (alert, ts first seen firing)
    # pct -> (ts, eta_s, eta_low_s, eta_high_s, baseline: rows left over the 60 s row rate)
    eta_at: dict[int, tuple[float, float, float, float, float]] = field(default_factory=dict)
    end_ts: float | None = None


def get(url: str, timeout: float = 10.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.read()


def config_text(jobs: list[Job], anchor: Path) -> str:
    """The daemon's configuration: the jobs, and an anchor (a job that is done: a daemon needs one)."""
    text = (f"[daemon]\nscan_interval = 1.0\nretire_grace = {GRACE}\n"
            f'\n[[job]]\nname = "anchor"\nevents = "{anchor}"\n')
    for j in jobs:
        text += (f'\n[[job]]\nname = "{j.name}"\nevents = "{j.events}"\npidfile = "{j.pidfile}"\n'
                 f"stall_after = {STALL_AFTER}\n")
    return text


def start_prometheus(tmp: Path, target: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    prom = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": "hsmon", "honor_labels": True,
                                "static_configs": [{"targets": [target]}]}]}
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(prom))
    proc = subprocess.Popen(["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=open(tmp / "prometheus.log", "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    return proc, port


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def firing(prom_port: int) -> list[tuple[str, str]]:
    url = f"http://127.0.0.1:{prom_port}/api/v1/alerts"
    try:
        alerts = json.loads(get(url, 5))["data"]["alerts"]
    except OSError:
        return []
    return [(a["labels"].get("alertname", "?"), a["labels"].get("job", "")) for a in alerts
            if a.get("state") == "firing"]


class Soak:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args, self.tmp, self.rng = args, tmp, random.Random(33)
        self.t0 = time.time()
        self.end = self.t0 + args.minutes * 60
        self.drain = self.t0 + args.minutes * 60 * 0.7  # no job starts after: all end, series must fall
        self.jobs: dict[str, Job] = {}
        self.configured: list[Job] = []
        self.started = 0
        self.samples: list[dict[str, float]] = []
        self.false_alerts: set[tuple[str, str]] = set()
        self.reloads = 0
        self.cfg = tmp / "hsmon.toml"
        self.anchor = tmp / "anchor.jsonl"
        self.anchor.write_text("".join(json.dumps({"v": 1, "ts": time.time(), "job": "anchor", "kind": k})
                                       + "\n" for k in ("start", "done")))
        self.cfg.write_text(config_text([], self.anchor))
        self.log = tmp / "daemon.log"
        self.daemon, self.url = daemon_process.spawn(["--config", str(self.cfg)], tmp / "port",
                                                     stderr=open(self.log, "wb"))  # noqa: SIM115
        self.ps = psutil.Process(self.daemon.pid)
        self.prom, self.prom_port = start_prometheus(tmp, self.url.split("://")[1])
        self.faults = {0.25: "stop", 0.4: "kill"}  # fraction of the run -> fault

    def new_job(self, now: float) -> Job:
        self.started += 1
        name = f"job{self.started:04d}"
        events, pidfile = self.tmp / f"{name}.jsonl", self.tmp / f"{name}.pid"
        seconds = min(self.rng.uniform(40, 120), max(20.0, self.drain + 60 - now))
        rows = max(50, int(seconds * TOKENS_PER_S / 2100))
        rot = ("none", "rename", "copytruncate")[self.started % 3]
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(events), name, str(rows),
                                 str(self.started), rot])
        pidfile.write_text(str(proc.pid))
        return Job(name, proc, events, pidfile, rows)

    def reload(self, now: float, final: bool = False) -> None:
        keep = [] if final else [j for j in self.configured if j.end_ts is None or now - j.end_ts < 5]
        if now < self.drain and not final:
            alive = len([j for j in keep if j.end_ts is None])
            for _ in range(min(MAX_JOBS - alive, self.rng.randint(MAX_JOBS // 2, MAX_JOBS))):
                job = self.new_job(now)
                self.jobs[job.name] = job
                keep.append(job)
        self.configured = keep
        self.cfg.write_text(config_text(keep, self.anchor))
        self.daemon.send_signal(signal.SIGHUP)
        self.reloads += 1

    def inject(self, now: float) -> None:
        for frac, kind in list(self.faults.items()):
            if now - self.t0 < frac * self.args.minutes * 60:
                continue
            alive = [j for j in self.configured if j.end_ts is None and j.fault is None and j.eta_at]
            if not alive:
                continue
            job = alive[0]
            job.proc.send_signal(signal.SIGSTOP if kind == "stop" else signal.SIGKILL)
            job.fault, job.fault_ts = kind, time.time()
            del self.faults[frac]
            print(f"[{now - self.t0:6.1f}s] fault: {kind} {job.name}", flush=True)

    def watch(self, now: float) -> None:
        for name, job_label in firing(self.prom_port):
            job = self.jobs.get(job_label)
            if job is not None and job.fault is not None:
                if job.alert is None:
                    job.alert = (name, now)
                    if job.fault == "stop":  # seen: let it go on, then end it
                        job.proc.send_signal(signal.SIGKILL)
                        job.proc.send_signal(signal.SIGCONT)
            else:
                self.false_alerts.add((name, job_label))
        try:
            status = json.loads(get(self.url + "/api/v1/status"))
        except OSError:
            return
        for js in status["jobs"]:
            job, prog = self.jobs.get(js["job"]), js.get("progress") or {}
            if job is None or not prog.get("rows_total") or prog.get("eta_s") is None:
                continue
            pct = 100.0 * (prog.get("rows_done") or 0) / prog["rows_total"]
            for mark in (5, 25, 50):
                if pct >= mark and mark not in job.eta_at:
                    eta, rate = float(prog["eta_s"]), prog.get("rows_per_s") or float("nan")
                    job.eta_at[mark] = (now, eta, prog.get("eta_low_s") or eta, prog.get("eta_high_s") or eta,
                                        (prog["rows_total"] - prog["rows_done"]) / rate)
        for job in self.jobs.values():
            if job.end_ts is None and job.proc.poll() is not None:
                job.end_ts = now

    def sample(self, now: float) -> None:
        t = time.perf_counter()
        text = get(self.url + "/metrics").decode()
        scrape_ms = (time.perf_counter() - t) * 1000
        cpu = self.ps.cpu_times()
        row = {"t": now - self.t0, "rss_mb": self.ps.memory_info().rss / 2**20, "fds": self.ps.num_fds(),
               "threads": self.ps.num_threads(), "cpu_s": cpu.user + cpu.system, "scrape_ms": scrape_ms,
               "series": sum(1 for line in text.splitlines() if line and not line.startswith("#")),
               "jobs": sum(1 for j in self.configured if j.end_ts is None)}
        if self.args.tui:
            row["tui_rss_mb"] = tui_rss()
        self.samples.append(row)
        print(json.dumps({k: round(v, 2) for k, v in row.items()}), flush=True)

    def run(self) -> None:
        time.sleep(3)
        self.sample(time.time())  # the start: no job yet
        next_reload = next_sample = time.time()
        reload_every = max(20.0, min(120.0, self.args.minutes * 60 / 12))
        while True:
            now = time.time()
            if now >= self.end:
                break
            if now >= next_reload:
                self.reload(now)
                next_reload = now + reload_every
            self.inject(now)
            self.watch(now)
            if now >= next_sample:
                self.sample(now)
                next_sample = now + 10
            time.sleep(max(0.0, 1.0 - (time.time() - now)))
        self.reload(time.time(), final=True)  # the last: every job gone
        time.sleep(GRACE + 5)
        self.sample(time.time())


def tui_rss() -> float:
    out = subprocess.run(["tmux", "list-panes", "-t", "hsmon-soak", "-F", "#{pane_pid}"],
                         capture_output=True, text=True).stdout.split()
    try:
        proc = psutil.Process(int(out[0]))
        return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)]) / 2**20
    except (IndexError, ValueError, psutil.Error):
        return float("nan")


def slope_per_h(points: list[tuple[float, float]]) -> float:
    if len(points) < 3:
        return float("nan")
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den * 3600 if den else float("nan")


def report(s: Soak) -> None:
    warm = min(600.0, s.args.minutes * 60 * 0.2)
    steady = [r for r in s.samples[1:-1] if r["t"] >= warm]
    rss_slope = slope_per_h([(r["t"], r["rss_mb"]) for r in steady])
    first, last = s.samples[0], s.samples[-1]
    scrapes = sorted(r["scrape_ms"] for r in s.samples)
    p99 = scrapes[min(len(scrapes) - 1, int(0.99 * len(scrapes)))]
    print(f"jobs started {s.started}, reloads {s.reloads}, samples {len(s.samples)}, "
          f"max jobs at once {max(r['jobs'] for r in s.samples)}")
    print(f"daemon RSS {first['rss_mb']:.1f} -> {last['rss_mb']:.1f} MB; slope after {warm:.0f} s warm-up "
          f"{rss_slope:+.2f} MB/h; CPU {last['cpu_s'] - first['cpu_s']:.1f} s")
    print(f"fds {first['fds']} -> {last['fds']} (max {max(r['fds'] for r in s.samples)}), threads "
          f"{first['threads']} -> {last['threads']}, series {first['series']} -> {last['series']} "
          f"(max {max(r['series'] for r in s.samples)})")
    print(f"scrape ms p50 {statistics.median(scrapes):.2f} p99 {p99:.2f}")
    print(f"alerts for healthy jobs: {len(s.false_alerts)} {sorted(s.false_alerts)}")
    missed = 0
    for job in s.jobs.values():
        if job.fault is None:
            continue
        limit = (STALL_AFTER if job.fault == "stop" else 0.0) + 2 * 1.0 + 5.0  # + scan and eval
        delay = job.alert[1] - job.fault_ts if job.alert else None
        missed += delay is None or delay > limit
        print(f"fault {job.fault} {job.name}: alert {job.alert[0] if job.alert else 'NONE'} after "
              f"{'-' if delay is None else f'{delay:.1f} s'} (limit {limit:.0f} s)")
    errors: dict[int, list[float]] = {5: [], 25: [], 50: []}
    base: dict[int, list[float]] = {5: [], 25: [], 50: []}
    inside = 0
    for job in s.jobs.values():
        if job.fault or job.end_ts is None or job.proc.returncode != 0:
            continue
        for mark, (ts, eta, low, high, rows_eta) in job.eta_at.items():
            actual = job.end_ts - ts
            if actual > 2:
                errors[mark].append(100.0 * abs(eta - actual) / actual)
                base[mark].append(100.0 * abs(rows_eta - actual) / actual)
                inside += low - 1.5 <= actual <= high + 1.5  # 1 s polls, 1 s scans
    medians = {m: statistics.median(v) if v else float("nan") for m, v in errors.items()}
    base_med = {m: statistics.median(v) if v else float("nan") for m, v in base.items()}
    print("ETA error, median over steady jobs: " + ", ".join(
        f"at {m} % {medians[m]:.1f} % (n={len(errors[m])}; rows over the 60 s row rate: {base_med[m]:.1f} %)"
        for m in errors))
    n_eta = sum(len(v) for v in errors.values())
    print(f"real end inside the ETA's range (+-1.5 s): {inside} of {n_eta}")
    reload_s = [float(x) for x in re.findall(r"reloaded in ([0-9.]+) s", s.log.read_text())]
    print(f"reload: {len(reload_s)} logged, max {max(reload_s, default=float('nan')):.3f} s")
    if s.args.tui:
        tui = [(r["t"], r["tui_rss_mb"]) for r in steady if r.get("tui_rss_mb") == r.get("tui_rss_mb")]
        print(f"TUI RSS slope {slope_per_h(tui):+.2f} MB/h")
    print(f"RESULT rss_slope_mb_h={rss_slope:.2f} false_alerts={len(s.false_alerts)} "
          f"fault_alerts_missed={missed} series_growth={last['series'] - first['series']} "
          f"fd_growth={last['fds'] - first['fds']} scrape_ms_p99={p99:.2f} "
          f"eta_error_pct={max(medians.values()):.1f} eta_error_baseline_pct={max(base_med.values()):.1f} "
          f"reload_s={max(reload_s, default=float('nan')):.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0,
                        help="length of the run (default 60; 5: a quick look)")
    parser.add_argument("--tui", action="store_true", help="also run `hsmon tui` in tmux and record its RSS")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hsmon-soak-", dir="/dev/shm"))
    soak = Soak(args, tmp)
    try:
        if args.tui:
            subprocess.run(["tmux", "new-session", "-d", "-s", "hsmon-soak", "-x", "160", "-y", "48",
                            f"{sys.executable} -m hsmon tui --url {soak.url}"], check=True,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
        soak.run()
        report(soak)
    finally:
        if args.tui:
            subprocess.run(["tmux", "kill-session", "-t", "hsmon-soak"], check=False)
        for job in soak.jobs.values():
            if job.proc.poll() is None:
                job.proc.kill()
                job.proc.send_signal(signal.SIGCONT)
                job.proc.wait()
        for proc in (soak.prom, soak.daemon):
            proc.terminate()
            proc.wait(timeout=30)
        subprocess.run(["rm", "-rf", str(tmp)], check=False)


if __name__ == "__main__":
    main()

"""Benchmark: a week of service compressed into ``--minutes``.

A real `hsmon daemon` (hsmon.daemon.spawn), a real Prometheus (Debian's `prometheus`) scraping it
every second with the shipped alert rules (dashboards/prometheus/hsmon-alerts.yml), and (unless
``--no-tui``) a real `hsmon tui` in tmux. Jobs start and finish all along (up to 20 at once), each a
writer process (bench/_soak_writer.py) of the project's own formats, added/removed by a reload
(SIGHUP with a rewritten hsmon.toml): contract-1 events for every job, and in turn none, a contract-2
output with its manifest, or an output plus a dump dir in /dev/shm (a file a row, created and
consumed). Events files are rotated both ways (rename + create, copytruncate); a retired job's
files are deleted after its grace. Injected at known times: a disk filled on a small real tmpfs
(mounted here: needs root) under a job's output, early (its rule waits `for: 5m`), a writer frozen
(SIGSTOP) past stall_after, a writer killed (SIGKILL).

Synthetic parts: the writers (no model, no GPU: a row is a sleep, ~10,500 tokens/s, i.e. ~5 rows/s
a job = 20x an assumed rate of 0.25 rows/s; row files hold 1 KiB of random bytes, dump files 4 KiB).
Half the jobs (in runs of nine) have the easy workload (a row's time follows its token count,
200-4000 tokens, +-30 % noise), half the real one (a real dataset's length mix, a prefill that
grows faster than the tokens, engine slowdowns of 2-4x for 5-40 s; bench/_soak_workload.py): the
ETA's error is reported for each (`eta_error_pct`, `eta_error_real_pct`).

Every 10 s: daemon RSS, fds, threads, CPU, /metrics scrape time and series, the TUI's RSS, fds and
threads, the load average; every 1 s: Prometheus's firing alerts and the daemon's status (ETA at
5/25/50 % of each job's rows; a job's rows and state clock must never go back); for 1.5 s after
each reload, a scrape every 50 ms.

    python bench/soak.py [--minutes 60] [--no-tui] [--warm-jobs 1000]
Ends with: RESULT rss_slope_mb_h=... false_alerts=... fault_alerts_missed=... series_growth=...
           scrape_ms_p99=... eta_error_pct=... eta_error_real_pct=... reload_ms=...
           tui_rss_slope_mb_h=... (bench/_soak_report.py)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from _soak_prewarm import prewarm  # bench/ is on sys.path: python bench/soak.py
from _soak_probes import DISK_MB, SmallDisk, fd_kinds, tui_figures
from _soak_prom import firing, get, start_prometheus
from _soak_report import report
from _soak_workload import real_lengths

from hsmon import daemon as daemon_process

REPO = Path(__file__).resolve().parent.parent
STALL_AFTER = 15.0
GRACE = 15.0
MAX_JOBS = 20
TOKENS_PER_S = 10_500.0

WRITER = REPO / "bench" / "_soak_writer.py"


@dataclass
class Job:
    name: str
    proc: subprocess.Popen[bytes]
    events: Path
    pidfile: Path
    rows: int
    out: Path | None = None
    dump: Path | None = None
    fault: str | None = None
    fault_ts: float | None = None
    alert: tuple[str, float] | None = None  # (alert, ts first seen firing)
    # pct -> (ts, eta_s, eta_low_s, eta_high_s, baseline: rows left over the 60 s row rate)
    eta_at: dict[int, tuple[float, float, float, float, float]] = field(default_factory=dict)
    end_ts: float | None = None
    seen: tuple[int, str, float] | None = None  # last status: rows_done, state, state_since_ts
    workload: str = "easy"  # bench/_soak_workload.py


def stopped(pid: int, timeout: float = 2.0) -> bool:
    """Whether the process is in the stopped state (``T`` in /proc/PID/stat) within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        if state == "T":
            return True
        if state in ("Z", "X"):
            return False
        time.sleep(0.01)
    return False


def config_text(jobs: list[Job], anchor: Path) -> str:
    """The daemon's configuration: the jobs, and an anchor (a job that is done: a daemon needs one)."""
    text = (f"[daemon]\nscan_interval = 1.0\nretire_grace = {GRACE}\n"
            f'\n[[job]]\nname = "anchor"\nevents = "{anchor}"\n')
    for j in jobs:
        text += (f'\n[[job]]\nname = "{j.name}"\nevents = "{j.events}"\npidfile = "{j.pidfile}"\n'
                 f"stall_after = {STALL_AFTER}\n")
        text += f'out_dir = "{j.out}"\n' if j.out else ""
        text += f'dump_dir = "{j.dump}"\n' if j.dump else ""
    return text


class Soak:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args, self.tmp, self.rng = args, tmp, random.Random(33)
        self.lengths = real_lengths(tmp / "real-lengths.txt")  # before the daemon: its start is not timed
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
        # the shipped unit's environment (systemd/hsmon-daemon.service): two malloc arenas
        self.daemon, self.url = daemon_process.spawn(["--config", str(self.cfg)], tmp / "port",
                                                     stderr=open(self.log, "wb"),  # noqa: SIM115
                                                     env={**os.environ, "MALLOC_ARENA_MAX": "2"})
        self.ps = psutil.Process(self.daemon.pid)
        self.prom, self.prom_port = start_prometheus(tmp, self.url.split("://")[1])
        # fraction of the run -> fault; the disk fault early: its rule waits 5 min (`for: 5m`)
        self.faults = {0.03: "disk", 0.25: "stop", 0.4: "kill"}
        self.disk = SmallDisk(tmp / "smalldisk")
        if not self.disk.mounted:
            del self.faults[0.03]
        self.cleanup: list[tuple[float, Job]] = []
        self.reload_jobs: list[int] = []
        self.reload_scrapes: list[float] = []
        self.state_lost: list[str] = []
        self.load = [os.getloadavg()]
        self.fds_seen: list[dict[str, int]] = []  # the daemon's fds by kind: at the start, at the end
        self.log_offset = 0  # the daemon log's size when the run started (after the warm-up)

    def warm_up(self, jobs: int) -> None:
        """The allocators' warm-up (bench/_soak_prewarm.py), then the run's clock starts."""
        t, rss = time.time(), self.ps.memory_info().rss / 2**20
        prewarm(self.daemon, self.url, self.cfg, config_text([], self.anchor), self.tmp, jobs)
        time.sleep(GRACE + 5)  # the warm-up's jobs leave the document and /metrics
        print(f"warm-up: {jobs} finished jobs in {time.time() - t:.0f} s, daemon RSS {rss:.1f} -> "
              f"{self.ps.memory_info().rss / 2**20:.1f} MB", flush=True)
        self.log_offset = self.log.stat().st_size  # its reloads are not the run's
        self.t0 = time.time()
        self.end = self.t0 + self.args.minutes * 60
        self.drain = self.t0 + self.args.minutes * 60 * 0.7

    def new_job(self, now: float, disk: Path | None = None) -> Job:
        """A writer: events only, + output and manifest, or + output, manifest and a dump dir in
        /dev/shm (in turn); ``disk``: the disk-full fault's job (output there, ~1 row/s, 20 min)."""
        self.started += 1
        name = f"job{self.started:04d}"
        events, pidfile = self.tmp / f"{name}.jsonl", self.tmp / f"{name}.pid"
        seconds = min(self.rng.uniform(40, 120), max(20.0, self.drain + 60 - now))
        rows, rate = max(50, int(seconds * TOKENS_PER_S / 2100)), TOKENS_PER_S
        rot = ("none", "rename", "copytruncate")[self.started % 3]
        kind = (self.started // 3) % 3
        out = self.tmp / f"{name}.out" if kind >= 1 else None
        dump = self.tmp / f"{name}.dump" if kind == 2 else None
        workload = ("easy", "real")[(self.started // 9) % 2]
        if disk is not None:
            out, dump, rows, rate = disk / name, None, 600, 1050.0  # ~0.5 rows/s, 20 min, 2.4 MB
            workload = "easy"
        cmd = [sys.executable, str(WRITER), str(events), name, str(rows), str(self.started), rot,
               "--rate", str(rate), "--row-bytes", str(4096 if disk else 1024), "--workload", workload]
        cmd += ["--lengths", str(self.lengths)] if workload == "real" else []
        cmd += ["--out", str(out)] if out else []
        cmd += ["--dump", str(dump)] if dump else []
        proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(REPO)})
        pidfile.write_text(str(proc.pid))
        return Job(name, proc, events, pidfile, rows, out, dump, workload=workload)

    def reload(self, now: float, final: bool = False, extra: Job | None = None) -> None:
        keep = [] if final else [j for j in self.configured if j.end_ts is None or now - j.end_ts < 5]
        if now < self.drain and not final and extra is None:
            alive = len([j for j in keep if j.end_ts is None])
            for _ in range(min(MAX_JOBS - alive, self.rng.randint(MAX_JOBS // 2, MAX_JOBS))):
                job = self.new_job(now)
                self.jobs[job.name] = job
                keep.append(job)
        if extra is not None:
            self.jobs[extra.name] = extra
            keep.append(extra)
        if len(keep) > len(self.configured) and not final:
            # the writers start before the reload: their interpreters' start (~20 python processes at
            # once) is the bench's load, not the daemon's; a reload's scrapes measure the daemon
            time.sleep(6)
        gone = [j for j in self.configured if j not in keep]
        self.cleanup += [(now + GRACE + 5, j) for j in gone]  # their files go once the grace is over
        self.configured = keep
        self.cfg.write_text(config_text(keep, self.anchor))
        self.daemon.send_signal(signal.SIGHUP)
        self.reloads += 1
        self.reload_jobs.append(len([j for j in keep if j.end_ts is None]))
        stop = time.perf_counter() + 1.5  # scrapes while the reload is applied
        while time.perf_counter() < stop:
            t = time.perf_counter()
            get(self.url + "/metrics")
            self.reload_scrapes.append((time.perf_counter() - t) * 1000)
            time.sleep(0.05)

    def clean(self, now: float) -> None:
        """Remove the files of jobs whose grace is over: the dump dirs and outputs come and go."""
        for item in [c for c in self.cleanup if c[0] <= now]:
            self.cleanup.remove(item)
            job = item[1]
            for path in (job.out, job.dump):
                if path is not None and path.parent == self.tmp:
                    shutil.rmtree(path, ignore_errors=True)
            for path in job.events.parent.glob(job.events.name + "*"):
                path.unlink(missing_ok=True)

    def inject(self, now: float) -> None:
        for frac, kind in list(self.faults.items()):
            if now - self.t0 < frac * self.args.minutes * 60:
                continue
            if kind == "disk":
                self.inject_disk(now)
                continue
            # the job furthest from its end, whose writer still runs: a job picked as it finishes (its
            # writer exited, not yet reaped) ends done, and no fault was injected (a 60-minute run at
            # 21:00 UTC on 2026-12-03 froze job0111 that way: "alert NONE")
            alive = [j for j in self.configured if j.end_ts is None and j.fault is None and j.eta_at
                     and j.seen is not None and j.proc.poll() is None]
            if not alive:
                continue
            job = max(alive, key=lambda j: j.rows - (j.seen[0] if j.seen else 0))
            job.proc.send_signal(signal.SIGSTOP if kind == "stop" else signal.SIGKILL)
            if kind == "stop" and not stopped(job.proc.pid):
                job.proc.send_signal(signal.SIGCONT)
                continue  # it ended meanwhile: another job, at the next pass
            job.fault, job.fault_ts = kind, time.time()
            del self.faults[frac]
            print(f"[{now - self.t0:6.1f}s] fault: {kind} {job.name}", flush=True)

    def inject_disk(self, now: float) -> None:
        """The disk-full fault: a job writes its output on a small tmpfs; once it has rows, a ballast
        file fills the tmpfs but 1 MiB, less than the job still writes (its alert: HsmonDiskWillNotFit)."""
        if self.disk.job is None:
            job = self.new_job(now, disk=self.disk.path)
            job.fault = "disk"
            self.disk.job = job
            self.reload(now, extra=job)
            print(f"[{now - self.t0:6.1f}s] disk job {job.name} on a {DISK_MB} MiB tmpfs", flush=True)
        elif self.disk.job.seen is not None and self.disk.job.seen[0] >= 10:
            self.disk.fill(1 << 20)
            self.disk.job.fault_ts = time.time()
            self.faults = {f: k for f, k in self.faults.items() if k != "disk"}
            print(f"[{now - self.t0:6.1f}s] fault: disk filled under {self.disk.job.name}", flush=True)

    def on_alert(self, job: Job, name: str, now: float) -> None:
        """A faulted job's first alert: seen; end the fault and the job."""
        job.alert = (name, now)
        if job.fault == "disk":
            self.disk.empty()
        job.proc.send_signal(signal.SIGKILL)
        job.proc.send_signal(signal.SIGCONT)

    def watch(self, now: float) -> None:
        for name, job_label, fired in firing(self.prom_port):
            job = self.jobs.get(job_label)
            if job_label.startswith("warm"):
                continue  # a warm-up job (bench/_soak_prewarm.py): finished, retired before the run
            if job is not None and job.fault is not None and job.fault_ts is not None:
                if job.alert is None:
                    self.on_alert(job, name, fired)
            else:
                self.false_alerts.add((name, job_label))
        try:
            status = json.loads(get(self.url + "/api/v1/status"))
        except OSError:
            return
        for js in status["jobs"]:
            job, prog = self.jobs.get(js["job"]), js.get("progress") or {}
            if job is None:
                continue
            self.check_state(job, prog.get("rows_done") or 0, js["state"], js.get("state_since_ts") or 0.0)
            if not prog.get("rows_total") or prog.get("eta_s") is None:
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

    def check_state(self, job: Job, rows: int, state: str, since: float) -> None:
        """A job keeps its state through reloads and rotations: its rows never go back, and the
        time it entered its state does not move while the state stays."""
        if job.seen is not None:
            old_rows, old_state, old_since = job.seen
            if rows < old_rows or (state == old_state and abs(since - old_since) > 1e-3):
                self.state_lost.append(f"{job.name}: rows {old_rows}->{rows}, {old_state}@{old_since:.1f}"
                                       f"->{state}@{since:.1f}")
        job.seen = (rows, state, since)

    def sample(self, now: float) -> None:
        t = time.perf_counter()
        text = get(self.url + "/metrics").decode()
        scrape_ms = (time.perf_counter() - t) * 1000
        cpu = self.ps.cpu_times()
        row = {"t": now - self.t0, "rss_mb": self.ps.memory_info().rss / 2**20, "fds": self.ps.num_fds(),
               "threads": self.ps.num_threads(), "cpu_s": cpu.user + cpu.system, "scrape_ms": scrape_ms,
               "series": sum(1 for line in text.splitlines() if line and not line.startswith("#")),
               "jobs": sum(1 for j in self.configured if j.end_ts is None), "load1": os.getloadavg()[0]}
        if self.args.tui:
            row.update(tui_figures())
        self.samples.append(row)
        print(json.dumps({k: round(v, 2) for k, v in row.items()}), flush=True)

    def run(self) -> None:
        time.sleep(3)
        self.sample(time.time())  # the start: no job yet
        self.fds_seen.append(fd_kinds(self.daemon.pid))
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
            self.clean(now)
            if now >= next_sample:
                self.sample(now)
                next_sample = now + 10
            time.sleep(max(0.0, 1.0 - (time.time() - now)))
        self.reload(time.time(), final=True)  # the last: every job gone
        time.sleep(GRACE + 5)
        self.sample(time.time())
        self.load.append(os.getloadavg())
        self.fds_seen.append(fd_kinds(self.daemon.pid))
        self.end_ts = time.time()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0,
                        help="length of the run (default 60; 5: a quick look)")
    parser.add_argument("--no-tui", dest="tui", action="store_false",
                        help="without `hsmon tui` in tmux (by default one runs: RSS, fds, threads recorded)")
    parser.add_argument("--warm-jobs", type=int, default=1000,
                        help="finished jobs churned through the daemon before the run, so that its "
                             "allocators reach their high-water mark (default 1000, ~2 min; 0: none)")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hsmon-soak-", dir="/dev/shm"))
    soak = Soak(args, tmp)
    try:
        if args.warm_jobs > 0:
            soak.warm_up(args.warm_jobs)
        if args.tui:
            subprocess.run(["tmux", "new-session", "-d", "-s", "hsmon-soak", "-x", "160", "-y", "48",
                            f"{sys.executable} -m hsmon tui --url {soak.url}"], check=True,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
        soak.run()
        report(soak, STALL_AFTER)
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
        soak.disk.unmount()
        subprocess.run(["rm", "-rf", str(tmp)], check=False)


if __name__ == "__main__":
    main()

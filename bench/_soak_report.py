"""bench/soak.py's report: the figures of a run and its RESULT line, with the soak's goals."""

from __future__ import annotations

import json
import math
import re
import statistics
import urllib.parse
import urllib.request
from typing import Any

NAN = float("nan")


def slope_per_h(points: list[tuple[float, float]]) -> float:
    points = [p for p in points if not math.isnan(p[1])]
    if len(points) < 3:
        return NAN
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den * 3600 if den else NAN


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else NAN


def prom_value(port: int, query: str) -> float:
    """One figure from the run's Prometheus (NaN when it has none)."""
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            result = json.loads(resp.read())["data"]["result"]
        return float(result[0]["value"][1]) if result else NAN
    except (OSError, KeyError, IndexError, ValueError):
        return NAN


def prom_scrape_p99(port: int, seconds: float) -> float:
    """Prometheus's own scrape_duration_seconds of the daemon over the run: its p99, in ms."""
    query = f'quantile_over_time(0.99, scrape_duration_seconds{{job="hsmon"}}[{int(seconds)}s])'
    return 1000 * prom_value(port, query)


def prom_scrapes_failed(port: int, seconds: float) -> float:
    """Prometheus's scrapes of the daemon that failed over the run (up == 0: its timeout is the 1 s
    interval). Each one marks every series stale, and restarts the `for:` clock of a rule on a bare
    gauge (the disk fault's alert was 405 s, not 300 s, after one)."""
    window = f'up{{job="hsmon"}}[{int(seconds)}s]'
    return prom_value(port, f"count_over_time({window}) - sum_over_time({window})")


def faults(s: Any, stall_after: float) -> tuple[int, int]:
    """Each injected fault's alert and its delay; (missed, not reachable in this run)."""
    limits = {"stop": stall_after, "kill": 0.0, "disk": 300.0}  # what the rule and state wait for
    missed = unreached = 0
    for job in s.jobs.values():
        if job.fault is None:
            continue
        limit = limits[job.fault] + 2 * 1.0 + 5.0  # + 2 scrapes, the scan and the evaluation
        if job.fault_ts is None:
            print(f"fault {job.fault} {job.name}: not injected")
            missed += 1
            continue
        delay = job.alert[1] - job.fault_ts if job.alert else None
        if delay is None and s.end_ts - job.fault_ts < limit:
            unreached += 1
            print(f"fault {job.fault} {job.name}: no alert, the run ended {s.end_ts - job.fault_ts:.0f} s "
                  f"after it (limit {limit:.0f} s): not reachable in a run this short")
            continue
        missed += delay is None or delay > limit
        print(f"fault {job.fault} {job.name}: alert {job.alert[0] if job.alert else 'NONE'} after "
              f"{'-' if delay is None else f'{delay:.1f} s'} (limit {limit:.0f} s)")
    return missed, unreached


def eta_errors(s: Any, workload: str = "easy") -> tuple[dict[int, float], dict[int, float]]:
    """The ETA's error at 5/25/50 % of the steady jobs of one workload (bench/_soak_workload.py)."""
    errors: dict[int, list[float]] = {5: [], 25: [], 50: []}
    base: dict[int, list[float]] = {5: [], 25: [], 50: []}
    inside = 0
    for job in s.jobs.values():
        if job.fault or job.end_ts is None or job.proc.returncode != 0 or job.workload != workload:
            continue
        for mark, (ts, eta, low, high, rows_eta) in job.eta_at.items():
            actual = job.end_ts - ts
            if actual > 2:
                errors[mark].append(100.0 * abs(eta - actual) / actual)
                base[mark].append(100.0 * abs(rows_eta - actual) / actual)
                inside += low - 1.5 <= actual <= high + 1.5  # 1 s polls, 1 s scans
    medians = {m: statistics.median(v) if v else NAN for m, v in errors.items()}
    base_med = {m: statistics.median(v) if v else NAN for m, v in base.items()}
    print(f"ETA error ({workload} workload), median over steady jobs: " + ", ".join(
        f"at {m} % {medians[m]:.1f} % (n={len(errors[m])}; rows over the 60 s row rate: {base_med[m]:.1f} %)"
        for m in errors))
    print(f"real end inside the ETA's range (+-1.5 s): {inside} of {sum(len(v) for v in errors.values())}")
    return medians, base_med


def report(s: Any, stall_after: float) -> None:
    warm = min(600.0, s.args.minutes * 60 * 0.2)
    steady = [r for r in s.samples[1:-1] if r["t"] >= warm]
    rss_slope = slope_per_h([(r["t"], r["rss_mb"]) for r in steady])
    first, last = s.samples[0], s.samples[-1]
    scrapes = [r["scrape_ms"] for r in s.samples]
    p99, reload_p99 = pct(scrapes, 0.99), pct(s.reload_scrapes, 0.99)
    prom_p99 = prom_scrape_p99(s.prom_port, s.end_ts - s.t0)
    prom_failed = prom_scrapes_failed(s.prom_port, s.end_ts - s.t0)
    kinds = [sum(1 for j in s.jobs.values() if (j.out is not None) + (j.dump is not None) == k)
             for k in (0, 1, 2)]
    print(f"jobs started {s.started} (events only {kinds[0]}, + output and manifest {kinds[1]}, + dump dir "
          f"in /dev/shm {kinds[2]}), reloads {s.reloads}, samples {len(s.samples)}, "
          f"max jobs at once {max(r['jobs'] for r in s.samples)}")
    print(f"daemon RSS {first['rss_mb']:.1f} -> {last['rss_mb']:.1f} MB; slope after {warm:.0f} s warm-up "
          f"{rss_slope:+.2f} MB/h; CPU {last['cpu_s'] - first['cpu_s']:.1f} s")
    print(f"daemon fds {first['fds']} -> {last['fds']} (max {max(r['fds'] for r in s.samples)}), threads "
          f"{first['threads']} -> {last['threads']} (max {max(r['threads'] for r in s.samples)}), series "
          f"{first['series']} -> {last['series']} (max {max(r['series'] for r in s.samples)})")
    print(f"daemon fds by kind at the start {s.fds_seen[0]}, at the end {s.fds_seen[-1]}")
    print(f"scrape ms (every 10 s) p50 {statistics.median(scrapes):.2f} p99 {p99:.2f} "
          f"max {max(scrapes):.2f}; during reloads (n={len(s.reload_scrapes)}) p50 "
          f"{pct(s.reload_scrapes, 0.5):.2f} p99 {reload_p99:.2f} "
          f"max {max(s.reload_scrapes, default=NAN):.2f}; "
          f"Prometheus's scrape_duration_seconds p99 {prom_p99:.2f}, its failed scrapes (over the 1 s "
          f"timeout) {prom_failed:.0f}")
    print(f"alerts for healthy jobs: {len(s.false_alerts)} {sorted(s.false_alerts)}")
    missed, unreached = faults(s, stall_after)
    medians, base_med = eta_errors(s)
    real_med, real_base = eta_errors(s, "real")
    reload_s = [float(x) for x in re.findall(r"reloaded in ([0-9.]+) s", s.log.read_text()[s.log_offset:])]
    reload_ms = 1000 * max(reload_s, default=NAN)
    print(f"reload: {len(reload_s)} logged, max {reload_ms:.0f} ms, up to {max(s.reload_jobs, default=0)} "
          f"jobs alive at a reload; jobs that lost state (rows back, or state clock moved): "
          f"{len(s.state_lost)} {s.state_lost[:5]}")
    tui = {"tui_rss_slope_mb_h": NAN, "tui_fd_growth": NAN, "tui_thread_growth": NAN}
    if s.args.tui:
        tui = {"tui_rss_slope_mb_h": slope_per_h([(r["t"], r["tui_rss_mb"]) for r in steady]),
               "tui_fd_growth": last["tui_fds"] - first["tui_fds"],
               "tui_thread_growth": last["tui_threads"] - first["tui_threads"]}
        print(f"TUI RSS {first['tui_rss_mb']:.1f} -> {last['tui_rss_mb']:.1f} MB (max "
              f"{max(r['tui_rss_mb'] for r in s.samples):.1f}), slope after warm-up "
              f"{tui['tui_rss_slope_mb_h']:+.2f} MB/h; fds {first['tui_fds']} -> {last['tui_fds']}, "
              f"threads {first['tui_threads']} -> "
              f"{last['tui_threads']}")
    loads = [r["load1"] for r in s.samples]
    load_median = statistics.median(loads)
    print(f"load average (1/5/15 min) at the start {'/'.join(f'{x:.2f}' for x in s.load[0])}, at the end "
          f"{'/'.join(f'{x:.2f}' for x in s.load[-1])}; 1-min load over the samples min {min(loads):.2f} "
          f"median {load_median:.2f} max {max(loads):.2f}"
          f"{' (a shared machine: not idle figures)' if load_median > 1.0 else ''}")
    print(f"RESULT rss_slope_mb_h={rss_slope:.2f} false_alerts={len(s.false_alerts)} "
          f"fault_alerts_missed={missed} fault_alerts_unreached={unreached} "
          f"series_growth={last['series'] - first['series']} fd_growth={last['fds'] - first['fds']} "
          f"thread_growth={last['threads'] - first['threads']} scrape_ms_p99={p99:.2f} "
          f"scrape_reload_ms_p99={reload_p99:.2f} scrape_prom_ms_p99={prom_p99:.2f} "
          f"scrapes_failed={prom_failed:.0f} "
          f"eta_error_pct={max(medians.values()):.1f} eta_error_baseline_pct={max(base_med.values()):.1f} "
          f"eta_error_real_pct={max(real_med.values()):.1f} "
          f"eta_error_real_baseline_pct={max(real_base.values()):.1f} "
          f"reload_ms={reload_ms:.0f} reload_jobs_max={max(s.reload_jobs, default=0)} "
          f"state_lost={len(s.state_lost)} " + " ".join(f"{k}={v:.2f}" for k, v in tui.items())
          + f" load1_median={load_median:.2f}")

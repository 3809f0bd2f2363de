"""`hsmon status`: one-shot status, from a daemon (``--url``) or straight from paths and a PID.

The JSON (``--json``) is the status document of docs/status-api.md, as /api/v1/status serves it.
Without a daemon it samples twice, ``--sample`` seconds apart, so that rates and activity exist.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from hsmon import config as cfgmod
from hsmon import job_flags
from hsmon.contracts.rejects import summary as rejects_summary
from hsmon.contracts.units import format_bytes, format_duration

DEFAULT_URL = f"http://{cfgmod.DEFAULT_HOST}:{cfgmod.DEFAULT_PORT}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", action="append", help=f"a running daemon (e.g. {DEFAULT_URL}); default "
                        "without path options. Several (one per host): their jobs in one table")
    parser.add_argument("--config", metavar="FILE", help="hsmon.toml: read every job in it without a daemon")
    job_flags.add_job_arguments(parser)
    parser.add_argument(
        "--sample",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="without a daemon: watch this long to measure activity (default 1)",
    )
    parser.add_argument("--json", action="store_true", help="print the status document as JSON")


def fetch(url: str, timeout: float = 5.0) -> dict[str, Any]:
    """GET the status document from a daemon."""
    import urllib.error
    import urllib.request

    full = url.rstrip("/") + "/api/v1/status"
    try:
        with urllib.request.urlopen(full, timeout=timeout) as resp:
            return json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise RuntimeError(
            f"cannot read {full}: {getattr(exc, 'reason', exc)}; is `hsmon daemon` running "
            "there? (or give --dump-dir/--out/--events/--pid to look without a daemon)"
        ) from None


def measure(jobs: list[cfgmod.JobConfig], sample_s: float) -> dict[str, Any]:
    """The status document measured in-process (no daemon)."""
    from hsmon.monitor import Monitor

    monitor = Monitor(jobs, use_watchdog=False, source="inprocess", scan_interval=max(sample_s, 0.01))
    try:
        monitor.tick(force_scan=True)
        time.sleep(max(0.0, sample_s))
        monitor.tick(force_scan=True)
        return monitor.status_document()
    finally:
        monitor.stop()  # the server trackers' threads


def _pct(done: Any, total: Any) -> str:
    return f" ({100.0 * done / total:.1f} %)" if isinstance(done, (int, float)) and total else ""


def _directory_state(section: dict[str, Any], summary: Callable[[dict[str, Any]], str]) -> str:
    """'missing', the tracker's read error, or the summary of a watched directory."""
    if not section["exists"]:
        return "missing"
    return section.get("error") or summary(section)


def _dump_summary(dump: dict[str, Any]) -> str:
    return (
        f"{dump['files']} files, {format_bytes(dump['bytes'])}, oldest "
        f"{format_duration(dump['oldest_age_s'])}, created {dump['created_total']}, "
        f"consumed {dump['consumed_total']}{_dump_rates(dump)}"
    )


def _output_summary(out: dict[str, Any]) -> str:
    reading = out.get("reading")
    if reading:
        done, total = reading["bytes_done"], reading["bytes_total"]
        return f"reading the manifest: {format_bytes(done)} of {format_bytes(total)}" + _pct(done, total)
    return (
        f"{out['layout']}: {out['chunks_complete']} chunks complete, "
        f"{out['chunks_in_progress']} in progress, {out['rows']} rows, {format_bytes(out['bytes'])}"
    )


def _dump_rates(dump: dict[str, Any]) -> str:
    created, consumed = dump.get("created_per_s"), dump.get("consumed_per_s")
    if created is None or consumed is None:
        return ""
    return f" ({created:.1f}/s in, {consumed:.1f}/s out)"


def _server_summary(srv: dict[str, Any]) -> str:
    """'UP: detail; model v0.5.23; SGLang's health check gives up at 20 s; running 2, queued 5, 310 tok/s'
    (figures only when known)."""
    parts = [f"{str(srv.get('state')).upper()}: {srv.get('detail') or ''}"]
    info = srv.get("info") or {}
    if srv.get("model"):
        parts.append(f"{srv['model']}" + (f" v{info['version']}" if info.get("version") else ""))
    health = srv.get("health") or {}
    if health.get("sglang_timeout_s") is not None:  # SGLang's own /health_generate timeout
        parts.append(f"SGLang's health check gives up at {health['sglang_timeout_s']:g} s")
    load = srv.get("load") or {}
    figures = [
        f"{name} {load[key]:.0f}" for key, name in (("running", "running"), ("queued", "queued"))
        if load.get(key) is not None
    ]
    if load.get("token_usage") is not None:
        figures.append(f"KV {100 * load['token_usage']:.0f} %")
    if load.get("gen_tokens_per_s") is not None:
        figures.append(f"{load['gen_tokens_per_s']:.0f} tok/s")
    if figures:
        parts.append(", ".join(figures))
    elif srv.get("metrics_enabled") is False:
        parts.append("no load figures (start it with --enable-metrics)")
    return "; ".join(parts)


def _gpu_lines(gpus: dict[str, Any] | None) -> list[str]:
    if not gpus:
        return []
    if not gpus.get("available"):
        return [f"gpus: {gpus.get('reason') or 'not watched'}"]
    lines = ["gpus:"]
    for d in gpus.get("devices") or []:
        util = "-" if d.get("utilization") is None else f"{100 * d['utilization']:.0f} %"
        power = "" if d.get("power_watts") is None else f", {d['power_watts']:.0f} W"
        temp = "" if d.get("temperature_celsius") is None else f", {d['temperature_celsius']} C"
        pids = ", ".join(str(p["pid"]) for p in d.get("processes") or []) or "none"
        lines.append(
            f"  gpu {d['index']}  {d.get('name') or ''}: util {util}, memory "
            f"{format_bytes(d.get('memory_used_bytes'))} / {format_bytes(d.get('memory_total_bytes'))}"
            f"{power}{temp}; PIDs {pids}"
        )
    return lines


def render(doc: dict[str, Any]) -> str:
    """A readable table of every job."""
    lines = []
    for job in doc["jobs"]:
        lines.append(
            f"{job['job']} [{job.get('kind')}]: {job['state'].upper()} for "
            f"{format_duration(doc['generated_ts'] - (job.get('state_since_ts') or doc['generated_ts']))}"
            f" — {job.get('reason', '')}"
        )
        rows = []
        prog = job.get("progress") or {}
        if prog:
            total = prog.get("rows_total")
            rows.append(
                (
                    "rows",
                    f"{prog.get('rows_done')}"
                    + (f" / {total}" if total else "")
                    + _pct(prog.get("rows_done"), total),
                )
            )
            if prog.get("tokens_done"):
                rows.append(
                    (
                        "tokens",
                        f"{prog['tokens_done']}"
                        + (f" / {prog['tokens_total']}" if prog.get("tokens_total") else ""),
                    )
                )
            if prog.get("chunks_done") is not None and prog.get("chunks_total"):
                rows.append(("chunks", f"{prog['chunks_done']} / {prog['chunks_total']}"))
            if prog.get("rejects"):
                why = rejects_summary(prog.get("rejects_by_reason"))
                rows.append(("rejects", f"{prog['rejects']}" + (f": {why}" if why else "")))
            rate = prog.get("rows_per_s")
            if rate:
                rows.append(("rate", f"{rate:.2f} rows/s, ETA {format_duration(prog.get('eta_s'))}"))
            if prog.get("elapsed_s") is not None:
                took = "took" if job.get("state") == "done" else "elapsed"
                rows.append((took, format_duration(prog["elapsed_s"])))
        dump = job.get("dump")
        if dump:
            state = _directory_state(dump, _dump_summary)
            rows.append(("dump", f"{dump['path']}: {state}"))
        out = job.get("output")
        if out:
            state = _directory_state(out, _output_summary)
            rows.append(("output", f"{out['path']}: {state}"))
        for d in job.get("disk") or []:
            fits = {True: "fits", False: "WILL NOT FIT", None: "fit unknown"}[d.get("fits")]
            rows.append(
                (
                    f"disk {d['role']}",
                    f"{d['path']}: {format_bytes(d['free_bytes'])} free, needs "
                    f"{format_bytes(d['needed_bytes'])}, {fits}; full in "
                    f"{format_duration(d['time_to_full_s'])}, done in {format_duration(d['time_to_done_s'])}",
                )
            )
        for p in job.get("processes") or []:
            if p["alive"]:
                cpu = f"{p['cpu_percent']:.0f} %" if p.get("cpu_percent") is not None else "-"
                rows.append(
                    (
                        p["role"],
                        f"PID {p['pid']} {p['status']}, CPU {cpu} ({p['cpu_seconds']:.1f} s), "
                        f"RSS {format_bytes(p['rss_bytes'])}, up {format_duration(p['uptime_s'])}, "
                        f"restarts {p['restarts']}",
                    )
                )
            else:
                rows.append((p["role"], f"{p['status']} ({p['cmdline']})"))
        ev = job.get("events")
        if ev:
            last = (
                format_duration(doc["generated_ts"] - ev["last_event_ts"]) + " ago"
                if ev.get("last_event_ts")
                else "none yet"
            )
            rows.append(
                (
                    "events",
                    f"{ev['path']}: {ev['lines']} lines ({ev['bad_lines']} bad), last "
                    f"{ev.get('last_kind') or '-'} {last}",
                )
            )
        for srv in job.get("servers") or []:
            rows.append((f"server {srv['url']}", _server_summary(srv)))
        tr = job.get("training")
        if tr:
            rows.append(
                (
                    "training",
                    f"step {tr.get('step')} epoch {tr.get('epoch')} loss {tr.get('loss')} "
                    f"acc {tr.get('acc')}",
                )
            )
        width = max((len(k) for k, _ in rows), default=0)
        lines += [f"  {k:<{width}}  {v}" for k, v in rows]
        for hint in job.get("hints", []):
            lines.append(f"  ! {hint['severity']}: {hint['message']}")
        lines.append("")
    if not doc["jobs"]:
        lines.append("no jobs watched")
    lines += _gpu_lines(doc.get("gpus"))
    return "\n".join(lines).rstrip() + "\n"


def run_many(urls: list[str], as_json: bool) -> int:
    """Several daemons: one table (or a JSON list of {url, status, error}); exit 1 when a job is
    stalled or dead or a daemon does not answer."""
    from concurrent.futures import ThreadPoolExecutor

    from hsmon.status_table import render_many

    def one(url: str) -> tuple[str, dict[str, Any] | None, str | None]:
        try:
            return url, fetch(url), None
        except RuntimeError as exc:
            return url, None, str(exc).split(";")[0]

    with ThreadPoolExecutor(max_workers=min(16, len(urls))) as pool:
        results = list(pool.map(one, urls))
    if as_json:
        print(json.dumps([{"url": u, "status": d, "error": e} for u, d, e in results], indent=2,
                         allow_nan=False, default=str))
    else:
        sys.stdout.write(render_many(results))
    bad = any(d is None or any(j.get("state") in ("stalled", "dead") for j in d["jobs"])
              for _, d, _ in results)
    return 1 if bad else 0


def run(args: argparse.Namespace) -> int:
    urls = args.url or []
    if len(urls) > 1 and not (args.config or job_flags.job_from_args(args)):
        return run_many(urls, args.json)
    args.url = urls[0] if urls else None
    try:
        job = job_flags.job_from_args(args)
        jobs = cfgmod.load_toml(args.config).jobs if args.config else []
        if job is not None:
            jobs.append(job)
        for each in jobs:
            each.verify = None  # the engine check is the daemon's: a one-shot look does not start one
        if jobs and args.url:
            raise cfgmod.ConfigError("give either --url or path/process options, not both")
        doc = measure(jobs, args.sample) if jobs else fetch(args.url or DEFAULT_URL)
    except (cfgmod.ConfigError, RuntimeError) as exc:
        print(f"hsmon status: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(doc, indent=2, allow_nan=False, default=str))
    else:
        sys.stdout.write(render(doc))
    bad = {"stalled", "dead"}
    return 1 if any(j.get("state") in bad for j in doc["jobs"]) else 0

"""`hsmon status`: one-shot status, from a daemon (``--url``) or straight from paths and a PID.

The JSON (``--json``) is the status document of docs/status-api.md, as /api/v1/status serves it.
Without a daemon it samples twice, ``--sample`` seconds apart, so that rates and activity exist.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from hsmon import __version__, job_flags
from hsmon.contracts.rejects import summary as rejects_summary
from hsmon.contracts.units import format_bytes, format_duration
from hsmon.core import config as cfgmod
from hsmon.status.text import disk_verdict, eta_text, online_rows, regenerate_rows, spec_text
from hsmon.status_doc import (
    ENDED_STATES,
    Capture,
    DumpSection,
    GpuSection,
    JobStatus,
    OutputSection,
    ProcessEntry,
    ServerEntry,
    StatusDocument,
    decode,
    figures,
    online_of,
    regenerate_of,
)
from hsmon.status_doc.numbers import counted

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
    parser.add_argument("--ca", metavar="FILE", help="check an https:// daemon's certificate against this "
                        "PEM file (its CA, or the self-signed certificate itself)")


def fetch(url: str, timeout: float = 5.0, ca: str | None = None) -> StatusDocument:
    """GET the status document from a daemon."""
    import http.client

    import msgspec

    from hsmon.status.client import StatusClient

    client = StatusClient(url, timeout, ca=ca)
    try:
        body = client.get()
    except (OSError, ValueError, http.client.HTTPException) as exc:
        raise RuntimeError(
            f"cannot read {client.url}: {exc}; is `hsmon daemon` running "
            "there? (or give --dump-dir/--out/--events/--pid to look without a daemon)"
        ) from None
    finally:
        client.close()
    try:
        return decode(body)
    except msgspec.DecodeError as exc:  # ValidationError included: it names the field
        raise RuntimeError(f"{client.url} answered no status document this hsmon reads ({exc}); is it an "
                           f"hsmon daemon of version {__version__}?") from None


def measure(jobs: list[cfgmod.JobConfig], sample_s: float) -> StatusDocument:
    """The status document measured in-process (no daemon)."""
    from hsmon.core.monitor import Monitor

    monitor = Monitor(jobs, use_watchdog=False, source="inprocess", scan_interval=max(sample_s, 0.01))
    try:
        monitor.tick(force_scan=True)
        time.sleep(max(0.0, sample_s))
        monitor.tick(force_scan=True)
        return monitor.status()
    finally:
        monitor.stop()  # the server trackers' threads


def _pct(done: Any, total: Any) -> str:
    return f" ({100.0 * done / total:.1f} %)" if isinstance(done, (int, float)) and total else ""


def _directory_state(section: DumpSection | OutputSection, summary: Callable[[Any], str]) -> str:
    """'missing', the tracker's read error, or the summary of a watched directory."""
    if not section.exists:
        return "missing"
    return section.error or summary(section)


def _dump_summary(dump: DumpSection) -> str:
    return (
        f"{counted(dump.files, 'file')}, {format_bytes(dump.bytes)}, oldest "
        f"{format_duration(dump.oldest_age_s)}, created {dump.created_total}, "
        f"consumed {dump.consumed_total}{_dump_rates(dump)}"
    )


def _output_summary(out: OutputSection) -> str:
    reading = out.reading
    if reading:
        done, total = reading.bytes_done, reading.bytes_total
        return f"reading the manifest: {format_bytes(done)} of {format_bytes(total)}" + _pct(done, total)
    if out.layout == "regenerate":  # a dataset: rows, no chunks
        return f"regenerate: {counted(out.rows, 'row')}, {format_bytes(out.bytes)}"
    return (
        f"{out.layout}: {counted(out.chunks_complete, 'chunk')} complete, "
        f"{out.chunks_in_progress} in progress, {counted(out.rows, 'row')}, {format_bytes(out.bytes)}"
    )


def _dump_rates(dump: DumpSection) -> str:
    created, consumed = dump.created_per_s, dump.consumed_per_s
    if created is None or consumed is None:
        return ""
    return f" ({created:.1f}/s in, {consumed:.1f}/s out)"


def capture_text(capture: Capture) -> str:
    """'DeepseekV3ForCausalLM tp 2, rule deepseek, captures points 3,5,6 (attention-TP rank 0 writes)'."""
    sizes = " ".join(f"{name} {value}" for name, value in (("tp", capture.tp_size), ("dp", capture.dp_size),
                                                          ("ep", capture.ep_size)) if value and value > 1)
    points = ",".join(map(str, capture.captured_points or [])) or "?"
    text = f"{capture.model_class}{' ' + sizes if sizes else ''}, rule {capture.capture_rule or 'unknown'}"
    return text + f", captures points {points}" + (f" ({capture.writer} writes)" if capture.writer else "")


def _server_summary(srv: ServerEntry) -> str:
    """'UP: detail; model v0.5.23; SGLang's health check gives up at 20 s; running 2, queued 5, 310 tok/s'
    (figures only when known)."""
    parts = [f"{srv.state.upper()}: {srv.detail or ''}"]
    version = srv.info.version if srv.info is not None else None
    if srv.model:
        parts.append(f"{srv.model}" + (f" v{version}" if version else ""))
    capture = srv.capture
    if capture is not None and capture.sglang_version:  # the capture plugin's release and adapter
        parts.append(f"SGLang {capture.sglang_version}, capture adapter {capture.adapter or 'aux-return'}")
    if capture is not None and capture.model_class:  # what the engine really captures
        parts.append(capture_text(capture))
    if srv.speculative is not None:  # the served drafter's acceptance
        parts.append(spec_text(srv.speculative))
    if srv.health.sglang_timeout_s is not None:  # SGLang's own /health_generate timeout
        parts.append(f"SGLang's health check gives up at {srv.health.sglang_timeout_s:g} s")
    load = srv.load
    figures = [f"{name} {value:.0f}" for name, value in (("running", load.running), ("queued", load.queued))
               if value is not None]
    if load.token_usage is not None:
        figures.append(f"KV {100 * load.token_usage:.0f} %")
    if load.gen_tokens_per_s is not None:
        figures.append(f"{load.gen_tokens_per_s:.0f} tok/s")
    if figures:
        parts.append(", ".join(figures))
    elif srv.metrics_enabled is False:
        parts.append("no load figures (start it with --enable-metrics)")
    return "; ".join(parts)


def _gpu_lines(gpus: GpuSection) -> list[str]:
    if not gpus.available:
        return [f"gpus: {gpus.reason or 'not watched'}"]
    lines = ["gpus:"]
    for d in gpus.devices:
        util = "-" if d.utilization is None else f"{100 * d.utilization:.0f} %"
        power = "" if d.power_watts is None else f", {d.power_watts:.0f} W"
        temp = "" if d.temperature_celsius is None else f", {d.temperature_celsius} C"
        pids = ", ".join(str(p.pid) for p in d.processes) or "none"
        lines.append(
            f"  gpu {d.index}  {d.name or ''}: util {util}, memory "
            f"{format_bytes(d.memory_used_bytes)} / {format_bytes(d.memory_total_bytes)}"
            f"{power}{temp}; PIDs {pids}"
        )
    return lines


def _progress_rows(job: JobStatus) -> list[tuple[str, str]]:
    prog = job.progress
    if figures.is_training(job.training):
        return _training_rows(job)  # a training counts steps: its rows and chunks never advance
    if prog is None:
        return []
    total = prog.rows_total
    rows = [("rows", f"{prog.rows_done}" + (f" / {total}" if total else "") + _pct(prog.rows_done, total))]
    if prog.tokens_done:
        of = f" / {prog.tokens_total}" if prog.tokens_total else ""
        rows.append(("tokens", f"{prog.tokens_done}{of}"))
    if prog.chunks_done is not None and prog.chunks_total:
        rows.append(("chunks", f"{prog.chunks_done} / {prog.chunks_total}"))
    if prog.rejects:
        why = rejects_summary(prog.rejects_by_reason)
        rows.append(("rejects", f"{prog.rejects}" + (f": {why}" if why else "")))
    if prog.rows_per_s:
        ended = job.state in ENDED_STATES  # no ETA on a job that ended
        eta = "" if ended else f", ETA {eta_text(prog, prog.eta_s, format_duration)}"
        rows.append(("rate", f"{prog.rows_per_s:.2f} rows/s{eta}"))
    if prog.elapsed_s is not None:
        rows.append(("took" if job.state == "done" else "elapsed", format_duration(prog.elapsed_s)))
    return rows


def _process_row(p: ProcessEntry) -> tuple[str, str]:
    if not p.alive:
        return p.role, f"{p.status} ({p.cmdline})"
    cpu = f"{p.cpu_percent:.0f} %" if p.cpu_percent is not None else "-"
    return p.role, (
        f"PID {p.pid} {p.status}, CPU {cpu} ({p.cpu_seconds or 0.0:.1f} s), "
        f"RSS {format_bytes(p.rss_bytes)}, up {format_duration(p.uptime_s)}, restarts {p.restarts}"
    )


def _job_rows(job: JobStatus, now: float) -> list[tuple[str, str]]:
    """The (label, text) rows of one job under its headline."""
    rows = _progress_rows(job)
    if job.dump:
        rows.append(("dump", f"{job.dump.path}: {_directory_state(job.dump, _dump_summary)}"))
    if job.output:
        rows.append(("output", f"{job.output.path}: {_directory_state(job.output, _output_summary)}"))
    for d in job.disk:
        verdict = disk_verdict(d)  # the dashboard's verdict: it says when the disk fills before done
        fits = "fit unknown" if verdict == "unknown" else verdict
        # the inodes only when they are the limit (a file per row can run out before the bytes)
        inodes = f"; needs {d.needed_inodes:,} files, {d.free_inodes:,} inodes free" \
            if d.short_of_inodes() else ""
        # no projection for an ended job: nothing is written any more
        ended = job.state in ENDED_STATES or (d.time_to_full_s is None and d.time_to_done_s is None)
        times = "" if ended else (
            f"; full in {format_duration(d.time_to_full_s)}, done in {format_duration(d.time_to_done_s)}")
        rows.append((
            f"disk {d.role}",
            f"{d.path}: {format_bytes(d.free_bytes)} free, needs {format_bytes(d.needed_bytes)}, {fits}"
            f"{times}{inodes}",
        ))
    rows += [_process_row(p) for p in job.processes]
    online = online_of(job)
    if online is not None:
        rows += [(f"online {label}", text) for label, text in online_rows(online)]
    regen = regenerate_of(job)
    if regen is not None:
        rows += regenerate_rows(regen, job.state in ENDED_STATES)
    ev = job.events
    if ev:
        last = format_duration(now - ev.last_event_ts) + " ago" if ev.last_event_ts else "none yet"
        rows.append(("events", f"{ev.path}: {ev.lines} lines ({ev.bad_lines} bad), last "
                               f"{ev.last_kind or '-'} {last}"))
    rows += [(f"server {srv.url}", _server_summary(srv)) for srv in job.servers]
    return rows


def _training_rows(job: JobStatus) -> list[tuple[str, str]]:
    """A training's progress: 'step 2 / 2, epoch 0, 13.0k tok/s', its figures, the time it took."""
    prog, tr = job.progress, job.training
    eta = None if job.state in ENDED_STATES else (prog.eta_s if prog is not None else None) or tr.eta_s
    rows = [("training", figures.step_text(tr) + (f", ETA {eta_text(prog, eta, format_duration)}"
                                                   if eta is not None else ""))]
    texts = figures.figure_texts(tr)
    if texts:
        rows.append(("figures", "; ".join(texts)))
    if prog is not None and prog.elapsed_s is not None:
        rows.append(("took" if job.state == "done" else "elapsed", format_duration(prog.elapsed_s)))
    return rows


def render(doc: StatusDocument) -> str:
    """A readable table of every job."""
    lines = []
    now = doc.generated_ts
    for job in doc.jobs:
        lines.append(f"{job.job} [{job.kind}]: {job.state.upper()} for "
                     f"{format_duration(now - (job.state_since_ts or now))} — {job.reason}")
        rows = _job_rows(job, now)
        width = max((len(k) for k, _ in rows), default=0)
        lines += [f"  {k:<{width}}  {v}" for k, v in rows]
        lines += [f"  ~ stale: {', '.join(b.stale) or '-'} (the {b.tracker} tracker is blind for "
                  f"{format_duration(now - b.since_ts)}: {b.error})" for b in job.blind or []]
        lines += [f"  ! {hint.severity}: {hint.message}" for hint in job.hints]
        lines.append("")
    if not doc.jobs:
        lines.append("no jobs watched")
    lines += _gpu_lines(doc.gpus)
    return "\n".join(lines).rstrip() + "\n"


def run_many(urls: list[str], as_json: bool, ca: str | None = None) -> int:
    """Several daemons: one table (or a JSON list of {url, status, error}); exit 1 when a job is
    stalled or dead or a daemon does not answer."""
    from concurrent.futures import ThreadPoolExecutor

    from hsmon.status.table import render_many

    def one(url: str) -> tuple[str, StatusDocument | None, str | None]:
        try:
            return url, fetch(url, ca=ca), None
        except RuntimeError as exc:
            return url, None, str(exc).split(";")[0]

    with ThreadPoolExecutor(max_workers=min(16, len(urls))) as pool:
        results = list(pool.map(one, urls))
    if as_json:
        print(_json([{"url": u, "status": d, "error": e} for u, d, e in results]))
    else:
        sys.stdout.write(render_many(results))
    bad = any(d is None or any(j.state in ("stalled", "dead") for j in d.jobs) for _, d, _ in results)
    return 1 if bad else 0


def run(args: argparse.Namespace) -> int:
    from hsmon.status.client import check_url

    try:
        urls = [check_url(url) for url in args.url or []]
        if args.out and not os.path.isdir(args.out):
            raise ValueError(f"--out {args.out}: no such directory; give the output directory of the job")
    except ValueError as exc:
        print(f"hsmon status: {exc}", file=sys.stderr)
        return 2
    if len(urls) > 1 and not (args.config or job_flags.job_from_args(args)):
        return run_many(urls, args.json, args.ca)
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
        doc = measure(jobs, args.sample) if jobs else fetch(args.url or DEFAULT_URL, ca=args.ca)
    except (cfgmod.ConfigError, RuntimeError) as exc:
        print(f"hsmon status: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(_json(doc))
    else:
        sys.stdout.write(render(doc))
    bad = {"stalled", "dead"}
    return 1 if any(j.state in bad for j in doc.jobs) else 0


def _json(value: Any) -> str:
    """Indented JSON of a status document (or of a list holding them)."""
    import msgspec

    return msgspec.json.format(msgspec.json.encode(value), indent=2).decode()

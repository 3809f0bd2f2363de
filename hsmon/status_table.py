"""`hsmon status --url A --url B`: the jobs of several daemons (one per host) in one table.

A daemon that does not answer is a row of its own (state UNREACHABLE, the reason), so a host that
went away is as visible as a stalled job.
"""

from __future__ import annotations

from typing import Any

from hsmon.contracts.units import format_duration

COLUMNS = ("DAEMON", "JOB", "KIND", "STATE", "FOR", "ROWS", "RATE", "ETA", "HINTS", "REASON")


def _host(url: str) -> str:
    return url.split("://", 1)[-1].rstrip("/")


def job_row(daemon: str, job: dict[str, Any], now: float) -> tuple[str, ...]:
    """One job's cells."""
    prog = job.get("progress") or {}
    done, total = prog.get("rows_done"), prog.get("rows_total")
    rows = "-" if done is None else f"{done}" + (f"/{total} ({100.0 * done / total:.0f} %)" if total else "")
    rate = prog.get("rows_per_s")
    training = job.get("training") or {}
    if training.get("step") is not None:
        steps = training.get("total_steps")
        rows = f"step {training['step']}" + (f"/{steps}" if steps else "")
    hints: dict[str, int] = {}
    for hint in job.get("hints") or []:
        hints[hint["severity"]] = hints.get(hint["severity"], 0) + 1
    since = job.get("state_since_ts")
    return (
        daemon,
        job["job"],
        str(job.get("kind") or "-"),
        str(job.get("state", "-")).upper(),
        format_duration(now - since) if since else "-",
        rows,
        f"{rate:.2f}/s" if rate else "-",
        format_duration(prog.get("eta_s")) if prog.get("eta_s") is not None else "-",
        ", ".join(f"{n} {sev}" for sev, n in sorted(hints.items())) or "-",
        str(job.get("reason") or ""),
    )


def render_many(results: list[tuple[str, dict[str, Any] | None, str | None]]) -> str:
    """``results``: (url, status document or None, error or None) per daemon, in the order given."""
    table: list[tuple[str, ...]] = []
    for url, doc, error in results:
        host = _host(url)
        if doc is None:
            table.append((host, "-", "-", "UNREACHABLE", "-", "-", "-", "-", "-", error or ""))
            continue
        if not doc["jobs"]:
            table.append((host, "-", "-", "NO JOBS", "-", "-", "-", "-", "-", ""))
        table += [job_row(host, job, doc["generated_ts"]) for job in doc["jobs"]]
    widths = [max(len(row[i]) for row in (COLUMNS, *table)) for i in range(len(COLUMNS) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1]
             for row in (COLUMNS, *table)]
    return "\n".join(line.rstrip() for line in lines) + "\n"

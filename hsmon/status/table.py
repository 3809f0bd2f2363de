"""`hsmon status --url A --url B`: the jobs of several daemons (one per host) in one table.

A daemon that does not answer is a row of its own (state UNREACHABLE, the reason), so a host that
went away is as visible as a stalled job.
"""

from __future__ import annotations

from hsmon.contracts.units import format_duration
from hsmon.status.text import eta_text
from hsmon.status_doc import JobStatus, StatusDocument

COLUMNS = ("DAEMON", "JOB", "KIND", "STATE", "FOR", "ROWS", "RATE", "ETA", "HINTS", "REASON")


def _host(url: str) -> str:
    return url.split("://", 1)[-1].rstrip("/")


def job_row(daemon: str, job: JobStatus, now: float) -> tuple[str, ...]:
    """One job's cells."""
    prog = job.progress
    done, total = (prog.rows_done, prog.rows_total) if prog else (None, None)
    rows = "-" if done is None else f"{done}" + (f"/{total} ({100.0 * done / total:.0f} %)" if total else "")
    rate = prog.rows_per_s if prog else None
    eta = prog.eta_s if prog else None
    training = job.training
    if training is not None and training.step is not None:
        steps = training.total_steps or None  # UNSET (not sent) reads as unknown
        rows = f"step {training.step}" + (f"/{steps}" if steps else "")
    hints: dict[str, int] = {}
    for hint in job.hints:
        hints[hint.severity] = hints.get(hint.severity, 0) + 1
    since = job.state_since_ts
    return (
        daemon,
        job.job,
        job.kind or "-",
        (job.state or "-").upper(),
        format_duration(now - since) if since else "-",
        rows,
        f"{rate:.2f}/s" if rate else "-",
        eta_text(prog, eta, format_duration) if eta is not None else "-",
        ", ".join(f"{n} {sev}" for sev, n in sorted(hints.items())) or "-",
        job.reason or "",
    )


def render_many(results: list[tuple[str, StatusDocument | None, str | None]]) -> str:
    """``results``: (url, status document or None, error or None) per daemon, in the order given."""
    table: list[tuple[str, ...]] = []
    for url, doc, error in results:
        host = _host(url)
        if doc is None:
            table.append((host, "-", "-", "UNREACHABLE", "-", "-", "-", "-", "-", error or ""))
            continue
        if not doc.jobs:
            table.append((host, "-", "-", "NO JOBS", "-", "-", "-", "-", "-", ""))
        table += [job_row(host, job, doc.generated_ts) for job in doc.jobs]
    widths = [max(len(row[i]) for row in (COLUMNS, *table)) for i in range(len(COLUMNS) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1]
             for row in (COLUMNS, *table)]
    return "\n".join(line.rstrip() for line in lines) + "\n"

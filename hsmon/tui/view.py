"""Pure functions from the status document (docs/status-api.md) to what the screens show.

No Textual here, so the arithmetic and wording are tested without a terminal. Every time shown
is derived from the document itself (``generated_ts``), never from the clock, so a fixed
document always renders the same screen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from msgspec import UNSET

from hsmon.contracts import train_defaults
from hsmon.contracts.units import format_bytes, format_duration
from hsmon.status.text import disk_verdict, eta_text, verdict_alarming
from hsmon.status_doc import (
    ENDED_STATES,
    DiskEntry,
    JobStatus,
    ProcessEntry,
    Progress,
    online_of,
)
from hsmon.status_doc.figures import fmt_loss, fmt_lr, fmt_measure
from hsmon.status_doc.numbers import (  # noqa: F401
    counted,
    fmt_clock,
    fmt_count,
    fmt_num,
    fmt_pct,
    fmt_pct_of,
    fmt_rate,
    shorten_path,
)
from hsmon.tui.event_text import (  # noqa: F401 (re-exported: the screens' one import)
    EVENT_FILTERS,
    acceptance_summary,
    event_line,
    event_matches,
    event_summary,
    filtered_events,
)
from hsmon.tui.history import FINISHED_STATES, HISTORY_POINTS, JobHistory  # noqa: F401 (re-exported)

STATE_STYLES: dict[str, str] = {
    "starting": "state-starting",
    "running": "state-running",
    "silent": "state-silent",
    "stalled": "state-stalled",
    "dead": "state-dead",
    "paused": "state-paused",
    "done": "state-done",
    "stopped": "state-stopped",
    "exited": "state-exited",
    "quiet": "state-quiet",
    "unknown": "state-unknown",
}
# Hints by which the monitor already reports a filesystem's trouble (then not said twice).
DISK_HINTS: dict[str, set[str]] = {"output": {"disk-wont-fit"}, "shm": {"shm-full-soon"}}


NO_PROGRESS = Progress(**dict.fromkeys(Progress.__struct_fields__))  # a job without a progress section


def sent(value: Any) -> Any:
    """A training figure the trainer may not send (``UNSET``) as None."""
    return None if value is UNSET else value


def fmt_byte_rate(n: float | None) -> str:
    return "-" if n is None else f"{format_bytes(n)}/s"


def fraction(done: float | None, total: float | None) -> float | None:
    """done/total clamped to [0, 1]; None when either is unknown or total is 0."""
    if done is None or not total:
        return None
    return max(0.0, min(1.0, float(done) / float(total)))


def progress_label(done: float | None, total: float | None) -> str:
    """'120 / 10,000 (1.2%)' or '120 / ?'."""
    frac = fraction(done, total)
    text = f"{fmt_count(done)} / {fmt_count(total) if total else '?'}"
    return f"{text} ({frac * 100:.1f}%)" if frac is not None else text


@dataclass(frozen=True)
class DiskLine:
    role: str
    path: str
    free: str
    needed: str
    fits: bool | None
    time_to_full: str
    time_to_done: str
    verdict: str
    projected: bool = True  # False: no time to full nor to done (an ended job writes no more)


def disk_lines(disks: Iterable[DiskEntry]) -> list[DiskLine]:
    """One line per watched filesystem, with a verdict a person can act on."""
    lines = []
    for disk in disks:
        lines.append(DiskLine(
            role=disk.role, path=disk.path,
            free=format_bytes(disk.free_bytes), needed=format_bytes(disk.needed_bytes),
            fits=disk.fits, time_to_full=fmt_clock(disk.time_to_full_s),
            time_to_done=fmt_clock(disk.time_to_done_s), verdict=disk_verdict(disk),
            projected=disk.time_to_full_s is not None or disk.time_to_done_s is not None,
        ))
    return lines


def disk_alarming(line: DiskLine) -> bool:
    return verdict_alarming(line.verdict)


def stale_sections(job: JobStatus) -> set[str]:
    """The job's sections standing on old figures: those a blind tracker feeds (``job.blind``)."""
    return {name for entry in job.blind or [] for name in entry.stale}


def process_rows(processes: Iterable[ProcessEntry], stale: bool = False) -> list[tuple[str, ...]]:
    """Rows of the processes table: role, PID, state, CPU %, RSS, uptime, restarts; ``stale``: the
    processes tracker is blind, its last figures are marked so (never a plain "running")."""
    rows = []
    for proc in processes:
        status = proc.status or ("running" if proc.alive else "gone")
        status = f"stale: {status}" if stale else status
        rows.append((
            proc.role, "-" if proc.pid is None else str(proc.pid), status,
            fmt_pct(proc.cpu_percent), format_bytes(proc.rss_bytes),
            fmt_clock(proc.uptime_s), str(proc.restarts),
        ))
    return rows


def alerts(job: JobStatus) -> list[tuple[str, str]]:
    """(severity, message) to show prominently: hints, disk trouble, and bad states."""
    out: list[tuple[str, str]] = []
    state = job.state
    hint_ids = {hint.id for hint in job.hints}
    if state in hint_ids:
        pass  # the monitor's own hint says it, with its fix
    elif state in ("stalled", "dead"):
        out.append(("critical", f"{state}: {job.reason or 'no reason given'}"))
    elif state in ("paused", "exited"):
        out.append(("warning", f"{state}: {job.reason}".rstrip(": ")))
    for hint in job.hints:
        out.append((hint.severity, hint.message or hint.id))
    for line in disk_lines(job.disk):
        if disk_alarming(line) and not hint_ids & DISK_HINTS.get(line.role, set()):
            out.append(("critical" if line.fits is False else "warning",
                        f"disk {line.role} ({line.path}): {line.verdict}: {line.free} free, "
                        f"{line.needed} still needed"))
    return out


def job_eta_s(job: JobStatus) -> float | None:
    """Seconds left; None for a job that has ended (a done job has no ETA, whatever a stale
    estimate in its training section says)."""
    if job.state in FINISHED_STATES:
        return None
    eta = job.progress.eta_s if job.progress is not None else None
    if eta is None and job.training is not None:
        return job.training.eta_s
    return eta


def job_elapsed_eta(job: JobStatus, fmt: Callable[[float | None], str] = fmt_clock) -> tuple[str, str]:
    """Elapsed and ETA as the dashboard shows them (``fmt_clock``: once a minute past a minute); a
    job that ended shows its elapsed time to the second (it no longer moves)."""
    elapsed = job.progress.elapsed_s if job.progress is not None else None
    ended = job.state in FINISHED_STATES
    return (format_duration if ended else fmt)(elapsed), eta_text(job.progress, job_eta_s(job), fmt)


def final_averages(job: JobStatus) -> dict[str, float | None]:
    """Rows/s, tokens/s and bytes/s over the whole run: the tracker's averages over every run's
    time (a resumed run's too), else, from an older daemon or the output directory alone, the done
    figures over elapsed; None when unknown."""
    progress = job.progress
    if progress is not None and progress.rows_per_s_avg is not UNSET and progress.rows_per_s_avg is not None:
        written = progress.bytes_per_s_avg if progress.bytes_per_s_avg is not UNSET else None
        tokens = progress.tokens_per_s_avg if progress.tokens_per_s_avg is not UNSET else None
        return {"rows": progress.rows_per_s_avg, "tokens": tokens, "bytes": written or None}
    elapsed = progress.elapsed_s if progress is not None else None
    written = job.output.bytes if job.output is not None else None

    def per_s(total: Any) -> float | None:
        ok = isinstance(total, (int, float)) and isinstance(elapsed, (int, float)) and elapsed > 0
        return float(total) / elapsed if ok else None

    rows, tokens = (progress.rows_done, progress.tokens_done) if progress is not None else (None, None)
    return {"rows": per_s(rows), "tokens": per_s(tokens), "bytes": per_s(written)}


def extraction_unfinished(job: JobStatus | None) -> bool:
    """True when an extraction job is not done, so a training would see only complete chunks."""
    if job is None or job.kind == "train" or job.state == "done":
        return False
    total = job.progress.chunks_total if job.progress is not None else None
    done = job.progress.chunks_done if job.progress is not None else None
    return not (total and done is not None and done >= total)


def complete_chunks(job: JobStatus | None) -> int | None:
    if job is None:
        return None
    value = job.output.chunks_complete if job.output is not None else None
    return value if value is not None or job.progress is None else job.progress.chunks_done


def find_start_event(job: JobStatus) -> dict[str, Any] | None:
    for event in reversed(job.recent_events):
        if event.get("kind") == "start":
            return event
    return None


def training_defaults(job: JobStatus | None) -> dict[str, str]:
    """Training form values prefilled from an (extraction) job."""
    defaults = {
        "data_dir": "", "target_model": "", "out_dir": "", "epochs": str(train_defaults.EPOCHS),
        "lr": fmt_lr(train_defaults.LR), "batch_tokens": str(train_defaults.BATCH_TOKENS),
        "ttt_length": str(train_defaults.TTT_LENGTH), "arch": "", "draft_vocab_size": "", "gpus": "1",
        "time_limit": "", "threads": "", "follow": "no", "passes": "1", "consume": "no",
    }
    if job is None:
        return defaults
    if online_of(job) is not None and job.state not in ENDED_STATES:  # a spool being written: follow it
        defaults.update(follow="yes", consume="yes")
    start = find_start_event(job) or {}
    output_path = job.output.path if job.output is not None else None
    data_dir = output_path or start.get("out_dir") or start.get("output_dir") or ""
    defaults["data_dir"] = str(data_dir)
    model = start.get("model") or start.get("target_model") or ""
    defaults["target_model"] = "" if model in (None, "embedded") else str(model)
    if data_dir:
        defaults["out_dir"] = str(data_dir).rstrip("/") + "-drafter"
    return defaults


def eval_lines(evaluation: dict[str, Any] | None) -> list[str]:
    """The trainer's held-out eval as a small table: accuracy and loss per draft position."""
    if not isinstance(evaluation, dict) or not evaluation:
        return []
    head = "held-out eval" + (f" at step {fmt_count(evaluation['step'])}" if "step" in evaluation else "")
    if isinstance(evaluation.get("rows"), (int, float)):
        head += f" ({counted(evaluation['rows'], 'row')})"
    lines = [head]
    accs, losses = evaluation.get("accs"), evaluation.get("losses")
    if isinstance(accs, list) and accs:
        lines.append("  acc  " + "".join(f"{fmt_pct_of(a):>6}" for a in accs))
    if isinstance(losses, list) and losses:
        lines.append("  loss " + "".join(f"{fmt_measure(v):>6}" for v in losses))
    extras = []
    if isinstance(evaluation.get("loss"), (int, float)):
        extras.append(f"weighted loss {fmt_measure(evaluation['loss'])}")
    if isinstance(evaluation.get("accept_len_est"), (int, float)):
        extras.append(f"est. acceptance length {fmt_num(evaluation['accept_len_est'])}")
    if extras:
        lines.append("  " + ", ".join(extras))
    shown = {"step", "rows", "accs", "losses", "loss", "accept_len_est", "acceptance_length"}
    others = [f"{k} {fmt_num(v) if isinstance(v, float) else v}" for k, v in evaluation.items()
              if k not in shown and isinstance(v, (int, float, str))]
    if others:
        lines.append("  " + ", ".join(others))
    return lines


def acceptance_result(job: JobStatus | None) -> dict[str, Any] | None:
    """`hsmon eval-drafter`'s result when ``job`` is such an evaluation that has reported it."""
    evaluation = job.training.eval if job is not None and job.training is not None else None
    if isinstance(evaluation, dict) and isinstance(evaluation.get("acceptance_length"), dict):
        return evaluation
    return None


def is_acceptance_job(job: JobStatus) -> bool:
    """An `hsmon eval-drafter` run (not a training), by its start event or its result."""
    start = find_start_event(job) or {}
    return start.get("backend") == "eval-drafter" or acceptance_result(job) is not None


def acceptance_so_far(job: JobStatus) -> str | None:
    """'drafter 1.82 at depth 3' (tokens per target forward over that drafter's and depth's decodes
    so far, from eval-drafter's newest decode event); None before a drafter's first decode."""
    for event in reversed(job.recent_events):
        if event.get("kind") == "rows" and isinstance(event.get("accept_len"), (int, float)):
            drafter = str(event.get("drafter"))
            name = {"eagle3": "drafter", "ngram": "n-gram"}.get(drafter, drafter)
            return f"{name} {fmt_num(event['accept_len'])} at depth {event.get('depth', '?')}"
    return None


def acceptance_lines(result: dict[str, Any] | None) -> list[str]:
    """Acceptance length per depth, the drafter beside the n-gram drafter, as a table."""
    if not result:
        return []
    lengths = result.get("acceptance_length") or {}
    depths = sorted({int(d) for per in lengths.values() if isinstance(per, dict) for d in per})
    lines = ["acceptance: tokens per target forward"]
    if isinstance(result.get("prompts"), int):
        match = result.get("outputs_match_greedy")
        verdict = {True: ", outputs equal greedy", False: ", OUTPUTS DIFFER FROM GREEDY"}.get(match, "")
        tokens = result.get("max_new_tokens", "?")
        prompts = f"{result['prompts']} prompt{'s' if result['prompts'] != 1 else ''}"
        lines.append(f"  {prompts} x {tokens} new tokens{verdict}")
    lines.append("  depth  " + "".join(f"{d:>6}" for d in depths))
    for name, label in (("eagle3", "drafter"), ("ngram", "n-gram")):
        per = lengths.get(name)
        if isinstance(per, dict):
            lines.append(f"  {label:<7}" + "".join(f"{fmt_num(per.get(str(d))):>6}" for d in depths))
    return lines


def status_line(job: JobStatus) -> str:
    """One plain line per job for logs and CI (`make demo` headless)."""
    progress, training = job.progress, job.training
    parts = [f"{job.job}: {job.state.upper()}"]
    acceptance = is_acceptance_job(job)
    # A training reports steps; its rows counter (the data it was started on) never advances.
    if progress is not None and progress.rows_done is not None and (training is None or acceptance):
        label = "decodes" if acceptance else "rows"
        parts.append(f"{label} {progress_label(progress.rows_done, progress.rows_total)}")
    if progress is not None and progress.tokens_per_s:
        parts.append(fmt_rate(progress.tokens_per_s, " tok/s"))
    so_far = acceptance_so_far(job) if acceptance and acceptance_result(job) is None else None
    if so_far:
        parts.append(f"acceptance so far: {so_far}")
    if training is not None and training.step is not None:
        loss = fmt_loss(training.loss)  # as `hsmon status` and the training tab write it
        parts.append(f"step {progress_label(training.step, sent(training.total_steps))}"
                     + (f" loss {loss}" if loss else ""))
    elapsed, eta = job_elapsed_eta(job, format_duration)  # a log line: to the second
    parts.append(f"elapsed {elapsed}" + ("" if job_eta_s(job) is None else f" ETA {eta}"))
    result = acceptance_result(job)
    if result is not None:
        parts.append(acceptance_summary(result))
    for line in disk_lines(job.disk):
        parts.append(f"{line.role} {line.free} free ({line.verdict})")
    for severity, message in alerts(job):
        parts.append(f"{severity.upper()}: {message}")
    return "  ".join(parts)


"""Pure functions from the status document (docs/status-api.md) to what the screens show.

No Textual here, so the arithmetic and wording are tested without a terminal. Every time shown
is derived from the document itself (``generated_ts``), never from the clock, so a fixed
document always renders the same screen.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from hsmon.units import format_bytes, format_duration

STATE_STYLES: dict[str, str] = {
    "starting": "state-starting",
    "running": "state-running",
    "silent": "state-silent",
    "stalled": "state-stalled",
    "dead": "state-dead",
    "paused": "state-paused",
    "done": "state-done",
    "quiet": "state-quiet",
}
ERROR_KINDS = frozenset({"error", "retry"})
REJECT_KINDS = frozenset({"reject"})
EVENT_FILTERS = ("all", "errors", "rejects")
HISTORY_POINTS = 60
# Hints by which the monitor already reports a filesystem's trouble (then not said twice).
DISK_HINTS: dict[str, set[str]] = {"output": {"disk-wont-fit"}, "shm": {"shm-full-soon"}}


def fmt_count(n: float | None) -> str:
    """12,345 or 1.2M style for counters; '-' when unknown."""
    if n is None:
        return "-"
    n = float(n)
    if abs(n) >= 1e9:
        return f"{n / 1e9:.2f}G"
    if abs(n) >= 1e6:
        return f"{n / 1e6:.2f}M"
    if abs(n) >= 1e4:
        return f"{n / 1e3:.1f}k"
    return f"{n:,.0f}"


def fmt_rate(n: float | None, unit: str = "/s") -> str:
    if n is None:
        return "-"
    if abs(n) >= 100:
        return f"{fmt_count(n)}{unit}"
    return f"{n:.2f}{unit}" if abs(n) < 10 else f"{n:.1f}{unit}"


def fmt_byte_rate(n: float | None) -> str:
    return "-" if n is None else f"{format_bytes(n)}/s"


def fmt_pct(n: float | None) -> str:
    return "-" if n is None else f"{n:.0f}%"


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


def disk_lines(disks: Iterable[dict[str, Any]] | None) -> list[DiskLine]:
    """One line per watched filesystem, with a verdict a person can act on."""
    lines = []
    for disk in disks or []:
        fits = disk.get("fits")
        ttf, ttd = disk.get("time_to_full_s"), disk.get("time_to_done_s")
        if fits is False:
            verdict = "WILL NOT FIT"
        elif ttf is not None and ttd is not None and ttf < ttd:
            verdict = "fills before done"
        elif fits:
            verdict = "fits"
        else:
            verdict = "unknown"
        lines.append(DiskLine(
            role=str(disk.get("role", "?")), path=str(disk.get("path", "?")),
            free=format_bytes(disk.get("free_bytes")), needed=format_bytes(disk.get("needed_bytes")),
            fits=fits, time_to_full=format_duration(ttf), time_to_done=format_duration(ttd),
            verdict=verdict,
        ))
    return lines


def disk_alarming(line: DiskLine) -> bool:
    return line.verdict in ("WILL NOT FIT", "fills before done")


def process_rows(processes: Iterable[dict[str, Any]] | None) -> list[tuple[str, ...]]:
    """Rows of the processes table: role, PID, state, CPU %, RSS, uptime, restarts."""
    rows = []
    for proc in processes or []:
        status = proc.get("status") or ("running" if proc.get("alive") else "gone")
        rows.append((
            str(proc.get("role", "?")), str(proc.get("pid", "-")), str(status),
            fmt_pct(proc.get("cpu_percent")), format_bytes(proc.get("rss_bytes")),
            format_duration(proc.get("uptime_s")), str(proc.get("restarts", 0)),
        ))
    return rows


def event_matches(event: dict[str, Any], which: str) -> bool:
    kind = event.get("kind")
    if which == "errors":
        return kind in ERROR_KINDS or (
            kind == "state" and (event.get("state") or event.get("to")) in ("dead", "stalled"))
    if which == "rejects":
        return kind in REJECT_KINDS
    return True


_SKIP_FIELDS = frozenset({"v", "ts", "job", "kind"})


def event_line(event: dict[str, Any], now_ts: float | None) -> str:
    """'  -3s reject row=12 reason=too long' — age relative to the document's time."""
    ts = event.get("ts")
    age = f"-{format_duration(now_ts - ts)}" if isinstance(ts, (int, float)) and now_ts else "?"
    details = " ".join(f"{k}={_short(v)}" for k, v in event.items() if k not in _SKIP_FIELDS)
    return f"{age:>7} {event.get('kind', '?'):<10} {details}".rstrip()


def _short(value: Any, width: int = 40) -> str:
    text = f"{value:.4g}" if isinstance(value, float) else str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def filtered_events(events: Iterable[dict[str, Any]] | None, which: str, limit: int) -> list[dict[str, Any]]:
    """The last ``limit`` events that pass the filter, oldest first."""
    chosen = [e for e in events or [] if event_matches(e, which)]
    return chosen[-limit:]


def alerts(job: dict[str, Any]) -> list[tuple[str, str]]:
    """(severity, message) to show prominently: hints, disk trouble, and bad states."""
    out: list[tuple[str, str]] = []
    state = job.get("state")
    hint_ids = {str(hint.get("id")) for hint in job.get("hints") or []}
    if state in hint_ids:
        pass  # the monitor's own hint says it, with its fix
    elif state in ("stalled", "dead"):
        out.append(("critical", f"{state}: {job.get('reason') or 'no reason given'}"))
    elif state == "paused":
        out.append(("warning", f"paused: {job.get('reason') or ''}".rstrip(": ")))
    for hint in job.get("hints") or []:
        out.append((str(hint.get("severity", "info")), str(hint.get("message", hint.get("id", "")))))
    for line in disk_lines(job.get("disk")):
        if disk_alarming(line) and not hint_ids & DISK_HINTS.get(line.role, set()):
            out.append(("critical" if line.fits is False else "warning",
                        f"disk {line.role} ({line.path}): {line.verdict}: {line.free} free, "
                        f"{line.needed} still needed"))
    return out


def job_elapsed_eta(job: dict[str, Any]) -> tuple[str, str]:
    progress = job.get("progress") or {}
    training = job.get("training") or {}
    eta = progress.get("eta_s")
    if eta is None:
        eta = training.get("eta_s")
    return format_duration(progress.get("elapsed_s")), format_duration(eta)


def extraction_unfinished(job: dict[str, Any] | None) -> bool:
    """True when an extraction job is not done, so a training would see only complete chunks."""
    if not job or job.get("kind") == "train":
        return False
    if job.get("state") == "done":
        return False
    progress = job.get("progress") or {}
    total, done = progress.get("chunks_total"), progress.get("chunks_done")
    return not (total and done is not None and done >= total)


def complete_chunks(job: dict[str, Any] | None) -> int | None:
    if not job:
        return None
    output = job.get("output") or {}
    value = output.get("chunks_complete")
    return value if value is not None else (job.get("progress") or {}).get("chunks_done")


def find_start_event(job: dict[str, Any]) -> dict[str, Any] | None:
    for event in reversed(job.get("recent_events") or []):
        if event.get("kind") == "start":
            return event
    return None


def training_defaults(job: dict[str, Any] | None) -> dict[str, str]:
    """Training form values prefilled from an (extraction) job."""
    defaults = {
        "data_dir": "", "target_model": "", "out_dir": "", "epochs": "1", "lr": "1e-4",
        "batch_tokens": "4096", "ttt_length": "7", "draft_vocab_size": "", "gpus": "1",
    }
    if not job:
        return defaults
    output = job.get("output") or {}
    start = find_start_event(job) or {}
    data_dir = output.get("path") or start.get("out_dir") or start.get("output_dir") or ""
    defaults["data_dir"] = str(data_dir)
    model = start.get("model") or start.get("target_model") or ""
    defaults["target_model"] = "" if model in (None, "embedded") else str(model)
    if data_dir:
        defaults["out_dir"] = str(data_dir).rstrip("/") + "-drafter"
    return defaults


def unroll_series(history: Iterable[dict[str, Any]], key: str) -> list[list[float]]:
    """Per unroll step, the series of ``key`` ('loss' or 'acc') across training updates."""
    series: list[list[float]] = []
    for training in history:
        values = training.get(key) or []
        for i, value in enumerate(values):
            while len(series) <= i:
                series.append([])
            if isinstance(value, (int, float)):
                series[i].append(float(value))
    return series


@dataclass
class JobHistory:
    """Recent figures of one job, for sparklines (the document carries only the current ones)."""

    rows_per_s: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    tokens_per_s: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    bytes_per_s: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    dump_files: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    training: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    last_generated_ts: float | None = None
    last_step: Any = None

    def add(self, job: dict[str, Any], generated_ts: float | None) -> bool:
        """Record one document's figures; False (nothing recorded) for a document already seen."""
        if generated_ts is not None and generated_ts == self.last_generated_ts:
            return False
        self.last_generated_ts = generated_ts
        progress = job.get("progress") or {}
        self.rows_per_s.append(float(progress.get("rows_per_s") or 0.0))
        self.tokens_per_s.append(float(progress.get("tokens_per_s") or 0.0))
        self.bytes_per_s.append(float(progress.get("bytes_per_s") or 0.0))
        dump = job.get("dump") or {}
        self.dump_files.append(float(dump.get("files") or 0.0))
        training = job.get("training")
        if training and training.get("step") != self.last_step:
            self.last_step = training.get("step")
            self.training.append(training)
        return True


def status_line(job: dict[str, Any]) -> str:
    """One plain line per job for logs and CI (`make demo` headless)."""
    progress = job.get("progress") or {}
    parts = [f"{job.get('job', '?')}: {str(job.get('state', '?')).upper()}"]
    training = job.get("training") or {}
    # A training reports steps; its rows counter (the data it was started on) never advances.
    if progress.get("rows_done") is not None and not training:
        parts.append(f"rows {progress_label(progress.get('rows_done'), progress.get('rows_total'))}")
    if progress.get("tokens_per_s"):
        parts.append(fmt_rate(progress["tokens_per_s"], " tok/s"))
    if training.get("step") is not None:
        loss = training.get("loss") or []
        parts.append(f"step {progress_label(training['step'], training.get('total_steps'))}"
                     + (f" loss {loss[0]:.3f}" if loss else ""))
    elapsed, eta = job_elapsed_eta(job)
    parts.append(f"elapsed {elapsed} ETA {eta}")
    for line in disk_lines(job.get("disk")):
        parts.append(f"{line.role} {line.free} free ({line.verdict})")
    for severity, message in alerts(job):
        parts.append(f"{severity.upper()}: {message}")
    return "  ".join(parts)

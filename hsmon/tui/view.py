"""Pure functions from the status document (docs/status-api.md) to what the screens show.

No Textual here, so the arithmetic and wording are tested without a terminal. Every time shown
is derived from the document itself (``generated_ts``), never from the clock, so a fixed
document always renders the same screen.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from hsmon.contracts.units import format_bytes, format_duration
from hsmon.tui.event_text import (  # noqa: F401 (re-exported: the screens' one import)
    EVENT_FILTERS,
    acceptance_summary,
    event_line,
    event_matches,
    event_summary,
    filtered_events,
)
from hsmon.tui.numbers import fmt_clock, fmt_count, fmt_num, fmt_pct, fmt_pct_of, fmt_rate, shorten_path  # noqa: F401

STATE_STYLES: dict[str, str] = {
    "starting": "state-starting",
    "running": "state-running",
    "silent": "state-silent",
    "stalled": "state-stalled",
    "dead": "state-dead",
    "paused": "state-paused",
    "done": "state-done",
    "exited": "state-exited",
    "quiet": "state-quiet",
}
FINISHED_STATES = frozenset({"done", "dead", "exited"})
HISTORY_POINTS = 60
EVENT_HISTORY = 200  # a document carries the last 20 events; the log keeps more across documents
# Hints by which the monitor already reports a filesystem's trouble (then not said twice).
DISK_HINTS: dict[str, set[str]] = {"output": {"disk-wont-fit"}, "shm": {"shm-full-soon"}}


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
            fits=fits, time_to_full=fmt_clock(ttf), time_to_done=fmt_clock(ttd),
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
            str(proc.get("role", "?")), "-" if proc.get("pid") is None else str(proc["pid"]), str(status),
            fmt_pct(proc.get("cpu_percent")), format_bytes(proc.get("rss_bytes")),
            fmt_clock(proc.get("uptime_s")), str(proc.get("restarts", 0)),
        ))
    return rows


def alerts(job: dict[str, Any]) -> list[tuple[str, str]]:
    """(severity, message) to show prominently: hints, disk trouble, and bad states."""
    out: list[tuple[str, str]] = []
    state = job.get("state")
    hint_ids = {str(hint.get("id")) for hint in job.get("hints") or []}
    if state in hint_ids:
        pass  # the monitor's own hint says it, with its fix
    elif state in ("stalled", "dead"):
        out.append(("critical", f"{state}: {job.get('reason') or 'no reason given'}"))
    elif state in ("paused", "exited"):
        out.append(("warning", f"{state}: {job.get('reason') or ''}".rstrip(": ")))
    for hint in job.get("hints") or []:
        out.append((str(hint.get("severity", "info")), str(hint.get("message", hint.get("id", "")))))
    for line in disk_lines(job.get("disk")):
        if disk_alarming(line) and not hint_ids & DISK_HINTS.get(line.role, set()):
            out.append(("critical" if line.fits is False else "warning",
                        f"disk {line.role} ({line.path}): {line.verdict}: {line.free} free, "
                        f"{line.needed} still needed"))
    return out


def job_eta_s(job: dict[str, Any]) -> float | None:
    """Seconds left; None for a job that has ended (a done job has no ETA, whatever a stale
    estimate in its training section says)."""
    if job.get("state") in FINISHED_STATES:
        return None
    eta = (job.get("progress") or {}).get("eta_s")
    return eta if eta is not None else (job.get("training") or {}).get("eta_s")


def job_elapsed_eta(job: dict[str, Any], fmt: Callable[[float | None], str] = fmt_clock) -> tuple[str, str]:
    """Elapsed and ETA as the dashboard shows them (``fmt_clock``: once a minute past a minute); a
    job that ended shows its elapsed time to the second (it no longer moves)."""
    progress = job.get("progress") or {}
    ended = job.get("state") in FINISHED_STATES
    return (format_duration if ended else fmt)(progress.get("elapsed_s")), fmt(job_eta_s(job))


def final_averages(job: dict[str, Any]) -> dict[str, float | None]:
    """Rows/s, tokens/s and bytes/s over the whole run (done figures over elapsed); None when unknown."""
    progress = job.get("progress") or {}
    elapsed = progress.get("elapsed_s")
    written = (job.get("output") or {}).get("bytes")

    def per_s(total: Any) -> float | None:
        ok = isinstance(total, (int, float)) and isinstance(elapsed, (int, float)) and elapsed > 0
        return float(total) / elapsed if ok else None

    return {"rows": per_s(progress.get("rows_done")), "tokens": per_s(progress.get("tokens_done")),
            "bytes": per_s(written)}


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


def eval_lines(evaluation: dict[str, Any] | None) -> list[str]:
    """The trainer's held-out eval as a small table: accuracy and loss per unroll step."""
    if not isinstance(evaluation, dict) or not evaluation:
        return []
    head = "held-out eval" + (f" at step {fmt_count(evaluation['step'])}" if "step" in evaluation else "")
    if isinstance(evaluation.get("rows"), (int, float)):
        head += f" ({fmt_count(evaluation['rows'])} rows)"
    lines = [head]
    accs, losses = evaluation.get("accs"), evaluation.get("losses")
    if isinstance(accs, list) and accs:
        lines.append("  acc  " + "".join(f"{fmt_pct_of(a):>6}" for a in accs))
    if isinstance(losses, list) and losses:
        lines.append("  loss " + "".join(f"{fmt_num(v):>6}" for v in losses))
    extras = []
    if isinstance(evaluation.get("loss"), (int, float)):
        extras.append(f"weighted loss {fmt_num(evaluation['loss'])}")
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


def acceptance_result(job: dict[str, Any] | None) -> dict[str, Any] | None:
    """`hsmon eval-drafter`'s result when ``job`` is such an evaluation that has reported it."""
    evaluation = ((job or {}).get("training") or {}).get("eval")
    if isinstance(evaluation, dict) and isinstance(evaluation.get("acceptance_length"), dict):
        return evaluation
    return None


def is_acceptance_job(job: dict[str, Any]) -> bool:
    """An `hsmon eval-drafter` run (not a training), by its start event or its result."""
    start = find_start_event(job) or {}
    return start.get("backend") == "eval-drafter" or acceptance_result(job) is not None


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


@dataclass
class JobHistory:
    """Recent figures of one job, for sparklines (the document carries only the current ones)."""

    rows_per_s: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    tokens_per_s: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    bytes_per_s: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    dump_files: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    training: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=HISTORY_POINTS))
    events: list[dict[str, Any]] = field(default_factory=list)
    # per server URL: queued requests and generated tokens/s (hsmon/tui/engine_view.py draws them)
    server_queued: dict[str, deque[float]] = field(default_factory=dict)
    server_tokens_per_s: dict[str, deque[float]] = field(default_factory=dict)
    _event_keys: set[tuple[Any, ...]] = field(default_factory=set)
    last_generated_ts: float | None = None
    last_step: Any = None
    finished: bool = False

    def add(self, job: dict[str, Any], generated_ts: float | None, skipped: int = 0) -> bool:
        """Record one document's figures; False (nothing recorded) for a document already seen, and
        once the job has ended: its rates fall to zero then, and the history of the run is what a
        person wants to look at (until the job starts again). ``skipped``: documents read before
        this one that repeated the last recorded figures (not sent: hsmon/tui/clocks.py)."""
        if generated_ts is not None and generated_ts == self.last_generated_ts:
            return False
        self.last_generated_ts = generated_ts
        self._add_events(job.get("recent_events") or [])
        self.finished = job.get("state") in FINISHED_STATES
        if self.finished:
            self._add_training(job)  # the last step may arrive with the done
            return False
        for series in self._series():
            if series and skipped:
                series.extend([series[-1]] * min(skipped, HISTORY_POINTS))
        progress = job.get("progress") or {}
        self.rows_per_s.append(float(progress.get("rows_per_s") or 0.0))
        self.tokens_per_s.append(float(progress.get("tokens_per_s") or 0.0))
        self.bytes_per_s.append(float(progress.get("bytes_per_s") or 0.0))
        dump = job.get("dump") or {}
        self.dump_files.append(float(dump.get("files") or 0.0))
        for srv in job.get("servers") or []:
            load = srv.get("load") or {}
            for series, key in (
                (self.server_queued, "queued"), (self.server_tokens_per_s, "gen_tokens_per_s")
            ):
                points = series.setdefault(srv["url"], deque(maxlen=HISTORY_POINTS))
                points.append(float(load.get(key) or 0.0))
        self._add_training(job)
        return True

    def _series(self) -> list[deque[float]]:
        return [self.rows_per_s, self.tokens_per_s, self.bytes_per_s, self.dump_files,
                *self.server_queued.values(), *self.server_tokens_per_s.values()]

    def settled(self) -> bool:
        """Whether another document with the same figures leaves every sparkline as it is: the job
        ended (its history is frozen), or every series is full of one value."""
        return self.finished or all(len(series) == series.maxlen and series.count(series[0]) == len(series)
                                    for series in self._series())

    def backfill(self, rows_per_s: list[float], tokens_per_s: list[float], bytes_per_s: list[float]) -> None:
        """Put older readings (rebuilt from the events file) before the ones recorded so far."""
        for series, older in ((self.rows_per_s, rows_per_s), (self.tokens_per_s, tokens_per_s),
                              (self.bytes_per_s, bytes_per_s)):
            newer = list(series)
            series.clear()
            series.extend([*older, *newer])

    def _add_events(self, recent: list[dict[str, Any]]) -> None:
        """Merge a document's recent events into the kept ones (in time order, each once)."""
        for event in recent:
            key = (event.get("ts"), event.get("kind"), event.get("job"), event.get("state"))
            if key in self._event_keys:
                continue
            self._event_keys.add(key)
            ts = event.get("ts") if isinstance(event.get("ts"), (int, float)) else float("inf")
            at = len(self.events)
            while at and (self.events[at - 1].get("ts") or 0) > ts:
                at -= 1
            self.events.insert(at, event)
        if len(self.events) > EVENT_HISTORY:
            for old in self.events[:-EVENT_HISTORY]:
                self._event_keys.discard((old.get("ts"), old.get("kind"), old.get("job"), old.get("state")))
            del self.events[:-EVENT_HISTORY]

    def _add_training(self, job: dict[str, Any]) -> None:
        training = job.get("training")
        if training and training.get("step") != self.last_step:
            self.last_step = training.get("step")
            self.training.append(training)


def status_line(job: dict[str, Any]) -> str:
    """One plain line per job for logs and CI (`make demo` headless)."""
    progress = job.get("progress") or {}
    parts = [f"{job.get('job', '?')}: {str(job.get('state', '?')).upper()}"]
    training = job.get("training") or {}
    acceptance = is_acceptance_job(job)
    # A training reports steps; its rows counter (the data it was started on) never advances.
    if progress.get("rows_done") is not None and (not training or acceptance):
        label = "decodes" if acceptance else "rows"
        parts.append(f"{label} {progress_label(progress.get('rows_done'), progress.get('rows_total'))}")
    if progress.get("tokens_per_s"):
        parts.append(fmt_rate(progress["tokens_per_s"], " tok/s"))
    if training.get("step") is not None:
        loss = training.get("loss") or []
        parts.append(f"step {progress_label(training['step'], training.get('total_steps'))}"
                     + (f" loss {loss[0]:.3f}" if loss else ""))
    elapsed, eta = job_elapsed_eta(job, format_duration)  # a log line: to the second
    parts.append(f"elapsed {elapsed}" + ("" if job_eta_s(job) is None else f" ETA {eta}"))
    result = acceptance_result(job)
    if result is not None:
        parts.append(acceptance_summary(result))
    for line in disk_lines(job.get("disk")):
        parts.append(f"{line.role} {line.free} free ({line.verdict})")
    for severity, message in alerts(job):
        parts.append(f"{severity.upper()}: {message}")
    return "  ".join(parts)

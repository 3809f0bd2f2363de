"""What `hsmon online` says while both sides run, when one fails, and when they end.

`Progress` reads both sides' events (the extraction's DIR/extract-events.jsonl, the trainer's
DIR/spool/hsmon-train-events.jsonl) with the monitor's reader (hsmon.core.trackers.progress) and,
every ``every`` seconds, prints one line per side; on a terminal one progress line for both,
redrawn every second. `failure_line` is the one-line error a failed side left at the end of its log
(the refusal or the exception), repeated where the user looks. `summary_lines` ends a finished
run: the passes, the last loss, the estimated acceptance and the next command.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from hsmon.contracts import events as ev
from hsmon.contracts import spool
from hsmon.contracts.progress_line import ProgressLine
from hsmon.contracts.units import format_duration
from hsmon.core.trackers.progress import ProgressTracker
from hsmon.status_doc.figures import fmt_measure

TAIL_BYTES = 64 * 1024


def loss_of(training: dict[str, Any] | None) -> float | None:
    """A step's loss as one number (the weighted sum when the trainer wrote per-unroll losses)."""
    if not training:
        return None
    loss = training.get("loss_weighted", training.get("loss"))
    if isinstance(loss, list):
        loss = sum(x for x in loss if isinstance(x, (int, float))) if loss else None
    return float(loss) if isinstance(loss, (int, float)) else None


class Progress:
    """Both sides' progress lines (see the module's docstring)."""

    def __init__(self, out: Path, every: float, stream: TextIO | None = None) -> None:
        self.out, self.every = out, every
        self.stream = stream or sys.stdout
        self.terminal = bool(getattr(self.stream, "isatty", lambda: False)())
        self.extract = ProgressTracker(str(out / "extract-events.jsonl"))
        self.train = ProgressTracker(str(spool.train_events_path(out / "spool")))
        self.ledger = spool.LedgerReader(out / "spool", track_passes=False)
        self.started = time.monotonic()
        self._last = self.started
        self.line = ProgressLine("online", "rows", stream=self.stream, enabled=self.terminal)

    def tick(self, now: float | None = None) -> None:
        """Print when it is time: a redrawn line each second on a terminal, else every ``every`` s."""
        now = time.monotonic() if now is None else now
        interval = 1.0 if self.terminal else self.every
        if self.every <= 0 or now - self._last < interval:
            return
        self._last = now
        self.extract.poll()
        self.train.poll()
        self.ledger.poll()
        if self.terminal:  # the one progress line of every long command (hsmon/contracts/progress_line.py)
            x = self.extract
            state = self.extract_text().split(", ", 1)[1] if ", " in self.extract_text() else "extracting"
            self.line.update(x.rows_done, x.rows_total, f"extraction {state} | training: {self.train_text()}")
            return
        else:
            at = format_duration(now - self.started)
            self.stream.write(f"hsmon online: [{at}] extraction: {self.extract_text()}\n"
                              f"hsmon online: [{at}] training: {self.train_text()}\n")
        self.stream.flush()

    def end_line(self) -> None:
        """Leave the redrawn line (before any other line is printed)."""
        self.line.close()

    def extract_text(self) -> str:
        x = self.extract
        if not x.exists:
            return "starting"
        total = x.rows_total
        pct = f" ({100 * x.rows_done / total:.0f} %)" if total else ""
        text = f"{x.rows_done} / {total if total is not None else '?'} rows{pct}"
        if x.terminal_kind:
            return f"{text}, {x.terminal_kind}"
        if x.paused_reason == spool.PAUSE_SPOOL:
            return f"{text}, paused: the spool is full (waiting for the trainer)"
        if x.paused_reason:
            return f"{text}, paused ({x.paused_reason})"
        return text

    def train_text(self) -> str:
        t, ledger = self.train, self.ledger.ledger
        if not t.exists:
            return "starting"
        training = t.training or {}
        step, total = training.get("step"), training.get("total_steps")
        text = f"step {step if step is not None else 0}" + (f" / {total}" if total else "")
        loss = loss_of(training)
        if loss is not None:
            text += f", loss {fmt_measure(loss)}"
        text += f", {ledger.consumed_rows} rows consumed"
        if t.terminal_kind:
            return f"{text}, {t.terminal_kind}"
        if t.paused_reason == spool.PAUSE_ROWS:
            return f"{text}, waiting for rows"
        return text


def failure_line(log: Path) -> str | None:
    """The last line a failed side left in its log (its one-line error, or an exception's last
    line), without a redrawn progress line's earlier states; None for an empty log."""
    try:
        with open(log, "rb") as fh:
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - TAIL_BYTES))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    lines = [line.split("\r")[-1].strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    return lines[-1] if lines else None


def summary_lines(out: Path, model: str | None) -> list[str]:
    """The passes, the last loss, the estimated acceptance (and its advice) and the next command."""
    spool_dir = out / "spool"
    ledger = spool.read_ledger(spool_dir)
    early = ledger.ended_reason in ("max_steps", "out_of_time")
    how = "the training ended early (--max-steps or --time-limit)" if early else "done"
    lines = [f"hsmon online: {how}: {sum(ledger.passes.values())} passes over {len(ledger.passes)} rows "
             f"(E = {ledger.passes_target}); {ledger.consumed_rows} rows consumed "
             f"({ledger.consumed_bytes / 1e6:.1f} MB freed); drafter in {out / 'drafter'}"]
    path = spool.train_events_path(spool_dir)
    events = list(ev.iter_events(path)) if path.is_file() else []
    steps = [e for e in events if e.get("kind") == ev.STEP]
    done = [e for e in events if e.get("kind") == ev.DONE]
    loss = steps[-1].get("loss") if steps else None  # a step event's loss: the weighted sum
    est = done[-1].get("accept_len_est") if done else None
    figures = [f"last loss {fmt_measure(loss)} (step {steps[-1].get('step')})"
               if isinstance(loss, (int, float)) else "no loss logged"]
    figures.append(f"estimated acceptance length {est:.3f}" if isinstance(est, (int, float))
                   else "no estimate of the acceptance length (no held-out rows)")
    lines.append("hsmon online: " + "; ".join(figures))
    advice = done[-1].get("advice") if done else None
    if isinstance(advice, str) and advice:
        lines.append(advice)
    target = f" --target-model {model}" if model else ""
    lines.append(f"next: hsmon export-drafter {out / 'drafter'} --out {out / 'drafter-sglang'}; then "
                 f"hsmon eval-drafter --drafter {out / 'drafter-sglang'}{target} --prompts PROMPTS.jsonl")
    return lines

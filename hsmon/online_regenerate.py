"""`hsmon online --regenerate`: the first side of the pipeline, the target's own answers.

Before the extraction and the training start, a real `hsmon regenerate DATA --out DIR/regen` (the
same model, all the threads, the --regenerate-arg options) answers the dataset again; it logs to
DIR/regenerate.log and writes its events to DIR/regen-events.jsonl (the daemon of --daemon watches
it as a job of its own). While it runs, a progress line (rows, answer tokens per second, ETA) as for
the two sides after it. It ends well: the extraction reads DIR/regen (its finished dataset). It
fails: its one-line error is repeated and `hsmon online` exits 1. A signal stops it (resume with the
same command and --resume: a finished regeneration is not run again, an unfinished one resumes).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from hsmon.contracts import regen_layout
from hsmon.contracts.units import format_duration
from hsmon.core.trackers.progress import ProgressTracker
from hsmon.online_progress import failure_line

EVENTS = "regen-events.jsonl"
LOG = "regenerate.log"


def regen_dir(out: Path) -> Path:
    return out / "regen"


def regenerate_command(args: argparse.Namespace, data: str, out: Path, threads: int) -> list[str]:
    """`hsmon regenerate DATA --out DIR/regen` with the run's model and threads, then --regenerate-arg."""
    argv = [sys.executable, "-m", "hsmon", "regenerate", data, "--out", str(regen_dir(out)), "--events",
            str(out / EVENTS), "--job", "regenerate"]
    if args.model:
        argv += ["--model", args.model]
    if not any(a.split("=", 1)[0] in ("--backend", "--threads") for a in args.regenerate_arg):
        argv += ["--threads", str(threads)]
    return argv + list(args.regenerate_arg)


def progress_text(tracker: ProgressTracker) -> str:
    """'120 / 1000 rows (12 %), 2,480 tok/s, ETA 3m05s' (what the regeneration's events say)."""
    if not tracker.exists or not tracker.started:
        return "starting (loading the target)"
    snap = tracker.snapshot(time.time()).progress
    total = snap.rows_total
    pct = f" ({100 * (snap.rows_done or 0) / total:.0f} %)" if total else ""
    text = f"{snap.rows_done} / {total if total is not None else '?'} rows{pct}"
    if snap.tokens_per_s:
        text += f", {snap.tokens_per_s:,.0f} tok/s"
    if tracker.terminal_kind:
        return f"{text}, {tracker.terminal_kind}"
    if tracker.paused_reason:
        return f"{text}, paused ({tracker.paused_reason})"
    return text + (f", ETA {format_duration(snap.eta_s)}" if snap.eta_s is not None else "")


def finished(out: Path) -> bool:
    """Whether DIR/regen holds a finished regeneration (a --resume does not run it again)."""
    directory = regen_dir(out)
    return regen_layout.is_regeneration(directory) and regen_layout.unfinished_reason(directory) is None


def run_regeneration(argv: list[str], out: Path, stop: dict[str, int], every: float,
                     start: Any, end: Any, stream: IO[str] | None = None) -> int | None:
    """Run the regeneration to its end, saying how far it is every ``every`` seconds (a line redrawn
    each second on a terminal); None when it finished well, else `hsmon online`'s exit status.
    ``start(argv, log)`` starts a side and ``end(proc)`` stops one (hsmon.online's own)."""
    stream = stream or sys.stdout
    terminal = bool(getattr(stream, "isatty", lambda: False)())
    tracker = ProgressTracker(str(out / EVENTS))
    started = last = time.monotonic()
    with open(out / LOG, "ab") as log:
        proc: subprocess.Popen[bytes] = start(argv, log)
    try:
        while proc.poll() is None and not stop["signal"]:
            time.sleep(0.2)
            now = time.monotonic()
            if every > 0 and now - last >= (1.0 if terminal else every):
                last = now
                tracker.poll()
                at = format_duration(now - started)
                line = f"hsmon online: [{at}] regeneration: {progress_text(tracker)}"
                stream.write(f"\r{line[:199]:<199}" if terminal else line + "\n")
                stream.flush()
        if terminal and every > 0:
            stream.write("\n")
        if stop["signal"]:
            name = signal.Signals(stop["signal"]).name
            print(f"hsmon online: stopping the regeneration ({name}; resume with the same command and "
                  "--resume)", flush=True)
            return 128 + stop["signal"]
        if proc.returncode != 0:
            said = failure_line(out / LOG)
            print(f"hsmon online: the regeneration failed (status {proc.returncode}): {said or 'no message'} "
                  f"(see {out / LOG})", file=sys.stderr)
            stopped = proc.returncode in (128 + signal.SIGINT, 128 + signal.SIGTERM)  # a signal to it alone
            return proc.returncode if stopped else 1
        tracker.poll()
        print(f"hsmon online: regeneration done: {progress_text(tracker)} -> {regen_dir(out)}", flush=True)
        return None
    finally:
        end(proc)  # SIGTERM (it records where it stopped), SIGKILL if it does not end

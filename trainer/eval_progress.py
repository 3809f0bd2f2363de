"""What `hsmon eval-drafter` tells while it measures: on a terminal a progress line (the decodes, an
ETA: hsmon/contracts/progress_line.py), its events (with --events: the measurement as a job the
daemon and the TUI follow), and how it ended."""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path
from typing import Any

from hsmon.contracts import events as ev
from hsmon.contracts.progress_line import ProgressLine
from hsmon.contracts.units import format_duration


class EvalProgress:
    """Contract-1 events of a measurement (with --events): start, rows (one per decode), then
    eval and done carrying the result, or error, or stopped. ``done`` and ``total``: the decodes."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.started = args, time.monotonic()
        self.writer: ev.EventWriter | None = None
        self.done, self.total = 0, 0
        self.tokens = 0  # new tokens decoded so far, every decode counted
        self.measured: dict[tuple[str, int], list[int]] = {}  # (drafter, depth) -> [accepted, rounds]
        self.line = ProgressLine("eval-drafter", "decodes")
        self.first_decode: float | None = None

    def begin(self, drafter: Path, target: Path, prompts: int) -> None:
        """The measurement starts: ``prompts`` prompts, each decoded by the target alone, then by both
        drafters at every depth."""
        args = self.args
        self.total = prompts * (1 + 2 * args.depth)
        self.line.update(0, self.total, f"{prompts} prompts x (greedy + 2 drafters x {args.depth} depths)")
        if args.events:
            self.writer = ev.EventWriter(args.job, path=args.events)
            self.writer.emit(ev.START, backend="eval-drafter", pid=os.getpid(), drafter=str(drafter),
                             target_model=str(target), prompts=prompts, depth=args.depth,
                             max_new_tokens=args.max_new_tokens, rows_total=self.total,
                             tokens_total=self.total * args.max_new_tokens,
                             process_started_ts=ev.process_started())

    def decoded(self, drafter: str | None = None, depth: int | None = None, result: Any = None) -> None:
        """One decode done (``drafter`` and ``depth`` None: the target's greedy reference), with
        its ``DecodeResult``: the tokens decoded so far and the acceptance measured so far."""
        self.done += 1
        self.tokens += len(result.tokens) if result is not None else 0
        so_far: dict[str, Any] = {}
        if drafter is not None and depth is not None and result is not None:
            sums = self.measured.setdefault((drafter, depth), [0, 0])
            sums[0] += result.accepted
            sums[1] += result.rounds
            # tokens per target forward: each round its accepted drafts plus the target's own token
            so_far = {"drafter": drafter, "depth": depth,
                      "accept_len": round((sums[0] + sums[1]) / max(sums[1], 1), 4)}
        now = time.monotonic()
        if self.first_decode is None:
            self.first_decode = now
        eta = ""
        if self.done > 1:  # the first decode's time holds the warm-up: the rate from it on
            per_decode = (now - self.first_decode) / (self.done - 1)
            eta = f"eta {format_duration((self.total - self.done) * per_decode)}"
        self.line.update(self.done, self.total, eta)
        if self.writer:
            new = len(result.tokens) if result is not None else None
            planned = self.total * self.args.max_new_tokens  # at most: a decode may end at the EOS
            self.writer.emit(ev.ROWS, rows=1, rows_done=self.done, rows_total=self.total, tokens=new,
                             tokens_done=self.tokens, tokens_total=planned, **so_far)

    def finished(self, result: dict[str, Any]) -> None:
        self.line.close()
        if self.writer:
            self.writer.emit(ev.EVAL, **result)
            self.writer.emit(ev.DONE, seconds=round(time.monotonic() - self.started, 3), **result)
            self.close()

    def stopped(self, signum: int) -> None:
        self._last(ev.STOPPED, reason="signal", signal=signal.Signals(signum).name, rows_done=self.done,
                   rows_total=self.total or None, resume="rerun the same command")

    def failed(self, message: str) -> None:
        self._last(ev.ERROR, message=message)

    def _last(self, kind: str, **fields: Any) -> None:
        self.line.close()
        if not self.args.events:
            return
        if self.writer is None:
            self.writer = ev.EventWriter(self.args.job, path=self.args.events)
        self.writer.emit(kind, pid=os.getpid(), **fields)
        self.close()

    def close(self) -> None:
        self.line.close()
        if self.writer is not None:
            self.writer.close()
            self.writer = None

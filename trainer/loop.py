"""The training's step loop: where it is (`Cursor`), the steps, checkpoints, evaluation and ending.

`trainer/train.py` builds a `Training` (data, drafter, optimizer, where a resumed run was) and
calls `Training.run`; everything a step needs is on the object, so each part reads alone.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hsmon.contracts import events as ev
from hsmon.contracts import stop_signals, train_defaults
from hsmon.contracts.layout import atomic_write
from trainer.checkpoint import latest_checkpoint, save_checkpoint
from trainer.data import Batch, Prefetcher, RowRef, plan_epoch
from trainer.fed_rows import FedRows
from trainer.model import DrafterConfig, Eagle3Drafter
from trainer.nonfinite import LossGuard, backward_unless_nonfinite, skip_step
from trainer.objective import StepStats, TTTForward, step_stats, ttt_loss
from trainer.runtime import Dist, Heartbeat, exit_status, ranks_in_sync, rng_state, stopped_fields
from trainer.settings import TrainSettings

# tests: steps slow on purpose (seconds each), so that a signal sent at step N always lands before
# the run's end, whatever the machine's speed
STEP_DELAY_ENV = "HSMON_TRAIN_STEP_DELAY_S"


@dataclass
class Cursor:
    """Where the training is: optimizer steps taken, epoch, batches into the epoch, tokens seen."""

    step: int = 0
    epoch: int = 0
    position: int = 0
    tokens: int = 0

    def wrap(self, steps_per_epoch: int) -> None:
        """Start the next epoch once this one's batches are used."""
        if self.position >= steps_per_epoch:
            self.epoch, self.position = self.epoch + 1, 0


@dataclass
class Interval:
    """Throughput since the last ``step`` event: its start, tokens and seconds spent waiting for data."""

    start: float
    tokens: int = 0
    wait: float = 0.0


@dataclass
class Training:
    """Everything the step loop reads and moves; built by trainer/train.py."""

    settings: TrainSettings
    world: Dist
    writer: ev.EventWriter | None
    stop_requested: threading.Event
    drafter: Eagle3Drafter
    cfg: DrafterConfig
    forward: torch.nn.Module
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    scheduler: Any
    target_head: torch.Tensor
    draft_ids: torch.Tensor
    train_rows: list[RowRef]
    held_rows: list[RowRef]
    steps_per_epoch: int
    total_steps: int
    aux_layer_ids: list[int] | None
    cursor: Cursor
    nonfinite_rows: int = 0
    extra_state: dict[str, Any] | None = None  # more for the checkpoint (the following trainer's)
    fed: FedRows = field(init=False)  # the rows each taken step fed, when asked for (trainer/fed_rows.py)

    def __post_init__(self) -> None:
        self.fed = FedRows(self.world.rank)

    @property
    def autocast(self) -> bool:
        return self.world.device.type == "cuda"

    def checkpoint(self) -> Path | None:
        """Save the drafter, optimizer, schedule, cursor and every rank's RNG (rank 0 writes)."""
        rng = [rng_state()]
        if self.world.enabled:
            gathered: list[Any] = [None] * self.world.world
            dist.all_gather_object(gathered, rng[0])
            rng = gathered
        path = None
        if self.world.main:
            state = {
                "model": {
                    k: v for k, v in self.drafter.state_dict().items() if not k.startswith("embed_tokens.")
                },
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "step": self.cursor.step,
                "epoch": self.cursor.epoch,
                "position": self.cursor.position,
                "tokens": self.cursor.tokens,
                "rng": rng,
                "world_size": self.world.world,
                "drafter_config": self.cfg.to_dict(),
                "aux_layer_ids": self.aux_layer_ids,
                "target_model": str(self.settings.target),
                "total_steps": self.total_steps,
                **(self.extra_state or {}),
            }
            path = save_checkpoint(self.settings.out, self.cursor.step, state, self.settings.keep_checkpoints)
            assert self.writer is not None
            self.writer.emit(ev.CHECKPOINT, step=self.cursor.step, path=str(path), epoch=self.cursor.epoch)
        self.world.barrier()
        return path

    def evaluate_and_emit(self) -> StepStats | None:
        """Evaluate on the held-out rows (rank 0) and emit the ``eval`` event; every rank waits."""
        stats = None
        if self.world.main:
            stats = evaluate(
                self.drafter,
                self.held_rows,
                self.settings,
                self.target_head,
                self.draft_ids,
                self.world.device,
                self.autocast,
            )
            if stats and self.writer:
                self.writer.emit(
                    ev.EVAL,
                    step=self.cursor.step,
                    rows=len(self.held_rows),
                    losses=stats.losses,
                    accs=stats.accs,
                    loss=stats.weighted_loss,
                    accept_len_est=expected_accept_length(stats.accs),
                )
        self.world.barrier()
        return stats

    def run(self, checkpointed: bool) -> int:
        """Train until the step budget, a stop signal or the time limit; then checkpoint and end."""
        counters: dict[str, Any] = {
            "step": self.cursor.step,
            "tokens": self.cursor.tokens,
            "total_steps": self.total_steps,
        }
        heartbeat = Heartbeat(self.writer, self.settings.heartbeat_s, counters)
        last_ckpt_step = self.cursor.step if checkpointed else -1
        guard = LossGuard(self.settings.max_skips_in_a_row)
        deadline = (
            time.monotonic() + self.settings.time_limit_s if self.settings.time_limit_s is not None else None
        )
        interval = Interval(time.perf_counter())
        ended: str | None = "stopped" if self._stop_asked() else None  # while it loaded: no step at all
        while self.cursor.step < self.total_steps and ended is None:
            ended, saved = self._epoch(guard, counters, interval, deadline)
            last_ckpt_step = saved if saved is not None else last_ckpt_step
        heartbeat.close()
        if last_ckpt_step != self.cursor.step and self.cursor.step > 0:  # step 0: nothing learned to keep
            self.checkpoint()
        if ended == "stopped":
            resume = resume_text(self.settings, self.cursor.step)
            if self.writer:
                fields = stopped_fields(self.stop_requested, self.cursor.step, self.total_steps, resume)
                self.writer.emit(ev.STOPPED, reason="signal", tokens=self.cursor.tokens, **fields)
            if self.world.main:
                signum = getattr(self.stop_requested, "signum", None) or signal.SIGTERM
                of = f" of {self.total_steps}" if self.total_steps else ""
                stop_signals.say(f"hsmon train: stopped by {stop_signals.described(signum)} at step "
                                 f"{self.cursor.step}{of}: {resume}")
            return exit_status(self.stop_requested)
        self._emit_done(guard, out_of_time=ended == "out_of_time")
        return 0

    def _stop_asked(self) -> bool:
        """Whether any rank was asked to stop (every rank learns it: they stop at the same step)."""
        asked = torch.tensor([1.0 if self.stop_requested.is_set() else 0.0])
        return bool(self.world.all_sum(asked)[0] > 0)

    def _epoch(
        self, guard: LossGuard, counters: dict[str, Any], interval: Interval, deadline: float | None
    ) -> tuple[str | None, int | None]:
        """The rest of the current epoch's batches. Returns how the loop ended ("stopped",
        "out_of_time" or None) and the step of the newest periodic checkpoint (None if none)."""
        world, cursor, settings = self.world, self.cursor, self.settings
        plan = plan_epoch(self.train_rows, settings.batch_tokens, settings.seed, cursor.epoch)
        mine = [plan[s * world.world + world.rank] for s in range(self.steps_per_epoch)]
        prefetch = Prefetcher([[self.train_rows[i] for i in b] for b in mine[cursor.position :]])
        waited, saved = 0.0, None
        try:
            for batch in prefetch:
                interval.wait += prefetch.wait_seconds - waited
                waited = prefetch.wait_seconds
                stop = self._step(batch, guard, counters, interval)
                if stop is None:  # skipped: non-finite loss or gradients
                    continue
                if stop:
                    return "stopped", saved
                if deadline is not None:
                    late = torch.tensor([float(time.monotonic() >= deadline)])
                    if world.all_sum(late)[0] > 0:  # every rank ends at the same step
                        return "out_of_time", saved
                if settings.checkpoint_every and cursor.step % settings.checkpoint_every == 0:
                    self.checkpoint()
                    saved = cursor.step
                if settings.eval_every and cursor.step % settings.eval_every == 0:
                    self.evaluate_and_emit()
                if cursor.step >= self.total_steps:
                    break
        finally:
            prefetch.close()
        return None, saved

    def _step(
        self, batch: Batch, guard: LossGuard, counters: dict[str, Any], interval: Interval
    ) -> bool | None:
        """One optimizer step. None when skipped (non-finite); else whether any rank was asked to stop."""
        if delay := float(os.environ.get(STEP_DELAY_ENV) or 0):
            time.sleep(delay)
        cursor, settings = self.cursor, self.settings
        self.optimizer.zero_grad(set_to_none=True)
        loss, sums = ttt_loss(
            self.forward,
            batch,
            self.target_head,
            self.draft_ids,
            settings.ttt_length,
            self.world.device,
            self.autocast,
        )
        what, grad_norm = backward_unless_nonfinite(loss, self.params, settings.grad_clip, self.world)
        if what:
            cursor.position += 1
            cursor.wrap(self.steps_per_epoch)
            skip_step(guard, self.writer, cursor.step, batch.rows, what, counters)
            return None
        guard.ok(cursor.step)
        self.optimizer.step()
        self.scheduler.step()
        self.fed.record(cursor.step, batch.rows)
        cursor.step += 1
        cursor.position += 1
        real = torch.tensor([float(batch.real_tokens), 1.0 if self.stop_requested.is_set() else 0.0])
        self.world.all_sum(sums)
        self.world.all_sum(real)
        cursor.tokens += int(real[0])
        interval.tokens += int(real[0])
        counters.update(step=cursor.step, tokens=cursor.tokens, epoch=cursor.epoch)
        if self.writer and (cursor.step % settings.log_every == 0 or cursor.step == self.total_steps):
            self._emit_step(sums, float(grad_norm), guard.skipped, interval)
        cursor.wrap(self.steps_per_epoch)
        return bool(real[1] > 0)

    def _emit_step(self, sums: torch.Tensor, grad_norm: float, skipped: int, interval: Interval) -> None:
        assert self.writer is not None
        now = time.perf_counter()
        elapsed = max(now - interval.start, 1e-9)
        stats = step_stats(sums)
        self.writer.emit(
            ev.STEP,
            step=self.cursor.step,
            total_steps=self.total_steps,
            epoch=self.cursor.epoch,
            loss=stats.weighted_loss,
            losses=stats.losses,
            accs=stats.accs,
            lr=self.scheduler.get_last_lr()[0],
            grad_norm=grad_norm,
            tokens=self.cursor.tokens,
            tokens_s=interval.tokens / elapsed,
            data_wait_frac=min(1.0, interval.wait / elapsed),
            skipped_steps=skipped,
        )
        interval.start, interval.tokens, interval.wait = now, 0, 0.0

    def _emit_done(self, guard: LossGuard, out_of_time: bool, ended_by: str | None = None) -> None:
        """The held-out evaluation, the estimate and the ``done`` event; ``ended_by``: the limit that
        ended the run (``time_limit``, ``max_steps``), None when its work was done."""
        stats = self.evaluate_and_emit()
        in_sync = ranks_in_sync(self.drafter, self.world)
        est = expected_accept_length(stats.accs) if stats else None
        if stats and self.world.main:
            write_estimate(latest_checkpoint(self.settings.out), self.cursor.step, stats.accs)
        advice = train_defaults.no_speedup_advice(
            est, self.settings.lr, "--passes" if self.settings.follow else "--epochs")
        if self.writer:
            self.writer.emit(
                ev.DONE,
                step=self.cursor.step,
                tokens=self.cursor.tokens,
                epochs_done=self.cursor.epoch,
                total_steps=self.total_steps,
                time_limit_reached=out_of_time,
                ended_by="time_limit" if out_of_time else ended_by,
                eval_accs=stats.accs if stats else None,
                skipped_steps=guard.skipped,
                nonfinite_rows=self.nonfinite_rows,
                ranks_in_sync=in_sync,
                checkpoint=str(latest_checkpoint(self.settings.out)),
                accept_len_est=est,
                advice=advice,
            )
        if self.world.main:
            print(done_line(self.settings, self.cursor.step, stats, advice), file=sys.stderr, flush=True)


def evaluate(
    drafter: Eagle3Drafter,
    rows: list[RowRef],
    settings: TrainSettings,
    target_head: torch.Tensor,
    draft_ids: torch.Tensor,
    device: torch.device,
    autocast: bool,
) -> StepStats | None:
    """Loss and accuracy per unroll step on (the first ``eval_batches`` batches of) ``rows``."""
    if not rows:
        return None
    plan = plan_epoch(rows, settings.batch_tokens, seed=12345, epoch=0)[: settings.eval_batches]
    sums = torch.zeros(3, settings.ttt_length, device=device)
    drafter.eval()
    forward = TTTForward(drafter)
    prefetch = Prefetcher([[rows[i] for i in b] for b in plan])
    try:
        with torch.no_grad():
            for batch in prefetch:
                sums += ttt_loss(
                    forward, batch, target_head, draft_ids, settings.ttt_length, device, autocast
                )[1]
    finally:
        prefetch.close()
    drafter.train()
    return step_stats(sums)


def resume_text(settings: TrainSettings, step: int) -> str:
    """How a stopped training goes on, in the words of whoever started it: the command line's
    --resume, or the dashboard's Resume button for a training launched through the daemon."""
    if step == 0:
        return "nothing trained yet (no checkpoint): start it again as before"
    if settings.launched:
        return (f"Resume (the dashboard's training form, or resume: yes in the launch API) goes on from "
                f"step {step}'s checkpoint")
    return f"rerun the same `hsmon train` command with --resume: it goes on from step {step}'s checkpoint"


def done_line(settings: TrainSettings, step: int, stats: StepStats | None, advice: str | None) -> str:
    """The training's last line: steps, held-out loss and estimated acceptance length, and when that
    stays near 1 the "no speed-up yet" advice (hsmon.contracts.train_defaults)."""
    line = f"hsmon train: done: {step} steps -> {settings.out}"
    if stats is None:
        return line + " (no held-out rows: no estimate of the acceptance length)"
    est = expected_accept_length(stats.accs)
    line += f"; held-out loss {stats.weighted_loss:.4g}, estimated acceptance length {est:.3f}"
    return f"{line}\n{advice}" if advice else line


def write_estimate(checkpoint: Path | None, step: int, accs: list[float]) -> None:
    """Beside the final checkpoint, ``<checkpoint>.eval.json``: the held-out accuracies per draft
    step and the acceptance length they predict, which `hsmon export-drafter` records in the
    export (``hsmon_estimate``) for the daemon to hold the served acceptance against."""
    if checkpoint is None:
        return
    body = {"step": step, "eval_accs": [float(a) for a in accs]}
    atomic_write(checkpoint.with_suffix(".eval.json"), lambda fh: fh.write(json.dumps(body).encode()))


def expected_accept_length(accs: list[float]) -> float:
    """1 + sum over k of the chance that the first k drafted tokens are all right, treating each
    step's accuracy (measured given a right prefix... approximately) as a conditional rate."""
    total, run = 1.0, 1.0
    for acc in accs:
        run *= acc
        total += run
    return total

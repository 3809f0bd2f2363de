"""`hsmon train SPOOL --follow --passes E [--consume]`: train on rows while `hsmon extract` writes them.

Set-up (trainer/follow_setup.py): the ledger's start record, the first complete chunk (shapes and
draft vocabulary), the step budget. Then a loop: poll the spool for complete chunks, admit them to
the replay window (trainer/window.py), draw a step's batches, take the step (trainer/loop.py's
`Training._step`, the offline trainer's step), give each drawn row a pass. Every
``--checkpoint-every`` steps, when it must wait for rows, and at the end: the ``trained`` record
(the passes since the last), then the checkpoint, then with --consume a ``consumed`` record and
the deletion of each chunk whose training rows all had their E passes. It ends when the
extraction has ended and no row is short of its passes, at --max-steps or --time-limit, or on
SIGTERM. Under torchrun every rank holds the same window (rank 0 reads the spool and hands each
poll over) and takes its share of each step's rows; rank 0 writes the ledger and deletes.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from typing import Any

import torch

from hsmon.contracts import events as ev
from hsmon.contracts import spool_fill
from hsmon.contracts.pauses import Pause
from hsmon.contracts.spool_ledger import LedgerWriter
from trainer.checkpoint import latest_checkpoint, load_checkpoint
from trainer.data import Batch, DataError, DataIndex, collate
from trainer.drafter_setup import aux_layer_ids, build_drafter, optimization, restore
from trainer.follow_budget import StepBudget
from trainer.follow_setup import (
    Arrival,
    LedgerState,
    checkpoint_saves,
    delete_rows,
    expected_training_rows,
    first_index,
    open_ledger,
    poll_spool,
    rows_pause,
    setup_sample,
    share,
    step_budget,
)
from trainer.loop import Cursor, Interval, Training
from trainer.nonfinite import LossGuard, NonFiniteError
from trainer.runtime import Dist, Heartbeat, exit_status, stopped_fields
from trainer.settings import TrainSettings
from trainer.window import ChunkRows, SpoolSource, Window

# what resumes a following trainer that stopped (the ledger keeps every row's passes)
FOLLOW_RESUME = ("rerun the same `hsmon train --follow` command with --resume: the ledger keeps every row's "
                 "passes")
FOLLOW_RESUME_LAUNCHED = ("Resume (the dashboard's training form, or resume: yes in the launch API) goes on: "
                          "the ledger keeps every row's passes")


def follow_resume(settings: TrainSettings) -> str:
    """How a stopped following trainer goes on, in the words of whoever started it."""
    return FOLLOW_RESUME_LAUNCHED if settings.launched else FOLLOW_RESUME
NO_EPOCHS = 1 << 62  # the cursor's epoch never wraps: a following trainer has no epochs
# tests: kill -9 of this process at a named point of a save (``trained``: after a trained record;
# ``final``: after the final save's; ``checkpoint``: after a checkpoint; ``consumed``: after a
# consumed record, before its files go; ``consumed:2`` the second), so a crash lands exactly there
KILL_AT_ENV = "HSMON_TRAIN_KILL_AT"


def _kill_point(name: str, count: dict[str, int]) -> None:
    """SIGKILL this process when HSMON_TRAIN_KILL_AT names this point (and its occurrence)."""
    at = os.environ.get(KILL_AT_ENV)
    if not at:
        return
    point, _, nth = at.partition(":")
    if point != name:
        return
    count[name] = count.get(name, 0) + 1
    if count[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)


def follow(settings: TrainSettings, world: Dist, writer: ev.EventWriter | None,
           stop_requested: threading.Event) -> int:
    """The body `trainer.train.train` runs for --follow (same signals, events and process group)."""
    # the optimizer's first construction imports torch's compiler stack (~2 s): done now, while the
    # extractor is still starting, rather than after the first chunk
    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
    resume_from = latest_checkpoint(settings.out) if settings.resume else None
    ckpt = load_checkpoint(resume_from) if resume_from else None
    ledger: LedgerWriter | None = None
    state: LedgerState | None = None
    if world.main:
        settings.out.mkdir(parents=True, exist_ok=True)
        ledger, state = open_ledger(settings, ckpt)
    state = share(world, state)
    assert state is not None
    source = SpoolSource(settings.data_dir, settings.max_length, state.heldout) if world.main else None
    pause = rows_pause(writer)
    arrived: list[ChunkRows] = []
    first: ChunkRows | None = None
    plan_rows = None
    heartbeat = Heartbeat(writer, settings.heartbeat_s, {"step": 0, "tokens": 0})  # alive while it waits
    try:
        while first is None:
            arrival = poll_spool(world, source, stop_requested.is_set())
            arrived += arrival.chunks
            plan_rows = arrival.plan_rows
            first = setup_sample(arrived, arrival)
            if first is None:
                if arrival.stop:
                    if ledger is not None:
                        ledger.ended("stopped", int(ckpt["step"]) if ckpt else 0, reason="stopped")
                    if writer:
                        writer.emit(ev.STOPPED, reason="signal", tokens=0,
                                    **stopped_fields(stop_requested, 0, None, follow_resume(settings)))
                    return exit_status(stop_requested)
                if arrival.ended:
                    raise DataError(f"{settings.data_dir}: the extraction ended without a usable row")
                pause.begin("no complete chunk in the spool yet (or, with --spool-max, rows for half of it)",
                            "the extraction's first chunk", settings.follow_poll_s, waiting_for="first chunk")
                time.sleep(settings.follow_poll_s)
    finally:
        heartbeat.close()
    if ckpt is not None:
        cfg = ckpt["drafter_config"]
        index = DataIndex([], Counter(), cfg["hidden_size"], cfg["hidden_size"] * cfg["num_aux"])
        vocab_from = None
        total_steps, budget_from = int(ckpt["total_steps"]), "checkpoint"
    else:
        index, vocab_from = share(world, first_index(first, settings.data_dir) if world.main else None)
        total_steps, budget_from = step_budget(settings, first, plan_rows, world, state.heldout)
    training = _training(settings, world, writer, stop_requested, index, ckpt, resume_from, total_steps)
    window = Window(settings.follow_passes, _window_rows(settings, first, world), state.passes)
    run = FollowRun(settings, world, writer, training, window, source, ledger, pause, state.consumed)
    run.budget = _budget(settings, training, ckpt, plan_rows, state)
    run.saves = checkpoint_saves(ckpt) or 0
    for chunk in arrived:
        run.admit(chunk)
    if writer:
        writer.emit(
            ev.START, backend="train", mode="follow", pid=os.getpid(), output_dir=str(settings.out),
            log=ev.own_log(),
            data_dir=str(settings.data_dir), target_model=str(settings.target), total_rows=plan_rows,
            passes=settings.follow_passes, consume=settings.follow_consume, window_rows=window.size,
            heldout=state.heldout.to_record(), hidden_size=training.cfg.hidden_size, layers=index.num_aux,
            draft_vocab_size=training.cfg.draft_vocab_size, arch=training.cfg.arch,
            vocab_from=vocab_from, setup_sample=first.name,
            ttt_length=settings.ttt_length, total_steps=total_steps, steps_from=budget_from,
            world_size=world.world, resumed_from=str(resume_from) if resume_from else None,
            start_step=training.cursor.step, dtype="bfloat16" if training.autocast else "float32",
            device=world.device.type,
        )  # fmt: skip
    return run.run(checkpointed=ckpt is not None)


def _window_rows(settings: TrainSettings, first: ChunkRows, world: Dist) -> int:
    """--window, or eight global batches' worth of rows as long as the set-up sample's."""
    if settings.follow_window:
        return settings.follow_window
    rows = first.train or first.held
    mean = sum(r.length for r in rows) / max(1, len(rows))
    return max(8, int(8 * world.world * settings.batch_tokens / max(mean, 1.0)))


def _budget(settings: TrainSettings, training: Training, ckpt: dict[str, Any] | None, plan_rows: int | None,
            state: LedgerState) -> StepBudget:
    """The step budget the schedule reads from now on (trainer/follow_budget.py): re-estimated as
    the run goes unless --max-steps fixes it; the warmup is the first start's."""
    total = training.total_steps
    warmup = ((ckpt or {}).get("follow") or {}).get("warmup") or max(1, int(settings.warmup_ratio * total))
    expected = None if settings.max_steps is not None else expected_training_rows(plan_rows, state.heldout)
    budget = StepBudget(total, int(warmup), settings.follow_passes, expected, training.cursor.step)
    training.scheduler.lr_lambdas = [budget.factor(settings.min_lr_ratio)]
    return budget


def _training(settings: TrainSettings, world: Dist, writer: ev.EventWriter | None,
              stop_requested: threading.Event, index: DataIndex, ckpt: dict[str, Any] | None,
              resume_from: Any, total_steps: int) -> Training:
    drafter, cfg, target_head = build_drafter(settings, index, ckpt, world.device)
    forward, params, optimizer, scheduler = optimization(settings, drafter, world, total_steps)
    cursor = restore(ckpt, resume_from, world, optimizer, scheduler) if ckpt is not None else Cursor()
    return Training(
        settings=settings, world=world, writer=writer, stop_requested=stop_requested, drafter=drafter,
        cfg=cfg, forward=forward, params=params, optimizer=optimizer, scheduler=scheduler,
        target_head=target_head, draft_ids=torch.nonzero(drafter.t2d, as_tuple=False).flatten(),
        train_rows=[], held_rows=[], steps_per_epoch=NO_EPOCHS, total_steps=total_steps,
        aux_layer_ids=aux_layer_ids(settings.data_dir), cursor=cursor, extra_state={},
    )  # fmt: skip


class FollowRun:
    """The following trainer's loop (see the module's docstring)."""

    def __init__(self, settings: TrainSettings, world: Dist, writer: ev.EventWriter | None,
                 training: Training, window: Window, source: SpoolSource | None,
                 ledger: LedgerWriter | None, pause: Pause, consumed: set[str]) -> None:
        self.settings, self.world, self.writer = settings, world, writer
        self.training, self.window, self.source = training, window, source
        self.ledger, self.pause = ledger, pause
        self.consumed_before = consumed
        self.rng = random.Random(settings.seed * 1_000_003 + training.cursor.step)
        self.training.held_rows = window.held
        self.starved = False
        self.deleted_rows = 0
        self.consumed_bytes = self.consumed_rows = 0  # what the ledger's consumed records hold
        self.waited_s = 0.0  # --time-limit counts seconds of steps: the waits for rows move it on
        self.budget: StepBudget | None = None
        self.kill_counts: dict[str, int] = {}
        self.saves = 0  # trained records this training wrote (the checkpoint keeps the count)
        self.skipped_steps = 0  # steps skipped for non-finite values (no pass credited)

    def admit(self, chunk: ChunkRows) -> None:
        consumed = chunk.name in self.consumed_before
        self.window.add(chunk, consumed=consumed)
        if consumed:
            self.consumed_bytes += chunk.train_bytes
            self.consumed_rows += len(chunk.train)
        if consumed and self.world.main:  # a kill between the consumed record and the deletion
            delete_rows([r for r in chunk.train if os.path.exists(r.path)])

    def run(self, checkpointed: bool) -> int:
        training, settings, cursor = self.training, self.settings, self.training.cursor
        counters: dict[str, Any] = {
            "step": cursor.step, "tokens": cursor.tokens, "total_steps": training.total_steps
        }
        heartbeat = Heartbeat(self.writer, settings.heartbeat_s, counters)
        guard = LossGuard(settings.max_skips_in_a_row)
        deadline = time.monotonic() + settings.time_limit_s if settings.time_limit_s is not None else None
        interval = Interval(time.perf_counter())
        self.saved_step = cursor.step if checkpointed else -1
        if checkpointed and settings.follow_consume:
            # chunks the checkpoint finished but a kill left unconsumed: consumed now, before any
            # wait for rows (with a full spool no step, hence no save, would ever come)
            self._consume()
        ended = None
        try:
            while ended is None:
                ended = self._iteration(guard, counters, interval, deadline)
        finally:
            heartbeat.close()
        self.save(force=True)
        if self.ledger is not None:
            # a limit the user set (--max-steps, --time-limit) is a normal end, as its done event says
            self.ledger.ended("stopped" if ended == "stopped" else "done", cursor.step, reason=ended)
        if ended == "stopped":
            if self.writer:
                fields = stopped_fields(self.training.stop_requested, cursor.step, None,
                                        follow_resume(self.settings))
                self.writer.emit(ev.STOPPED, reason="signal", tokens=cursor.tokens, **fields)
            return exit_status(self.training.stop_requested)
        self.training.nonfinite_rows = len(self.window.nonfinite)
        training._emit_done(guard, out_of_time=ended == "out_of_time",
                            ended_by="max_steps" if ended == "max_steps" else None)
        return 0

    def _iteration(self, guard: LossGuard, counters: dict[str, Any], interval: Interval,
                   deadline: float | None) -> str | None:
        """One poll and (when there are rows) one step; returns how the run ended, or None."""
        arrival = poll_spool(self.world, self.source, self.training.stop_requested.is_set())
        for chunk in arrival.chunks:
            self.admit(chunk)
        if arrival.chunks:
            self.starved = False
        if arrival.stop:
            return "stopped"
        if self.settings.max_steps is not None and self.training.cursor.step >= self.settings.max_steps:
            return "max_steps"
        if not self.window.active:
            if arrival.ended:
                return "done"
            self._wait(arrival, "every row on hand has had its passes")
            return None
        if self._thin(arrival):
            self._wait(arrival, "the replay window is thin", soft=True)
            return None
        on_hand = len(self.window.active)
        self.pause.end(f"{on_hand} rows on hand", rows_on_hand=on_hand)
        if self._spool_filling(arrival):
            self.save()
        return self._step(guard, counters, interval, deadline, arrival.ended)

    def _spool_filling(self, arrival: Arrival) -> bool:
        """With --consume and a spool limit: the rows waiting hold half the limit or more and a chunk
        is finished; saving now (not at the next --checkpoint-every) makes room before the
        extractor has to pause."""
        if not (self.settings.follow_consume and arrival.spool_limit):
            return False
        level = spool_fill.level(arrival.row_bytes, arrival.rows, self.consumed_bytes, self.consumed_rows,
                                 arrival.spool_limit)
        return level.half_full and bool(self.window.finished_chunks())

    def _thin(self, arrival: Arrival) -> bool:
        """Wait (while rows keep coming) rather than draw from fewer rows than a window half full:
        a row's passes would crowd into a few steps. Never while rows stop coming (no deadlock
        with a full spool) or after the extraction ended, nor with a spool limit (the spool, not the
        window, bounds the rows on hand then: waiting would only keep the extractor paused)."""
        return (not arrival.ended and not self.starved and bool(arrival.chunks) and not arrival.spool_limit
                and len(self.window.active) < self.window.size // 2)

    def _wait(self, arrival: Arrival, why: str, soft: bool = False) -> None:
        """No rows to draw: make finished chunks durable and consumed (room for the extractor), then
        sleep a poll interval."""
        if self.settings.follow_consume and self.window.finished_chunks():
            self.save()
        if not soft:
            self.pause.begin(why, "the extraction's next chunk", self.settings.follow_poll_s,
                             rows_seen=self.window.rows_seen)
        self.starved = not arrival.chunks or soft
        slept = time.monotonic()
        time.sleep(self.settings.follow_poll_s)
        self.waited_s += time.monotonic() - slept

    def _step(self, guard: LossGuard, counters: dict[str, Any], interval: Interval,
              deadline: float | None, ended: bool) -> str | None:
        world, training, settings = self.world, self.training, self.settings
        batches = self.window.draw(self.rng, settings.batch_tokens, world.world)
        drawn = [r.row for batch in batches for r in batch]
        mine = batches[world.rank]
        batch = collate(mine) if mine else _masked(collate([next(r for b in batches for r in b)]))
        try:
            stop = training._step(batch, guard, counters, interval)
        except NonFiniteError:  # one skip too many in a row: this one is in the ledger too
            self._skipped(len(drawn))
            raise
        if stop is None:  # skipped (non-finite): the weights did not move, no pass is credited
            self._skipped(len(drawn))
            return None
        self.window.credit(drawn)
        if stop:
            return "stopped"
        step = training.cursor.step
        if self.budget is not None:
            budget = self.budget.update(step, len(drawn), self.window, ended)
            training.total_steps = counters["total_steps"] = budget
        if deadline is not None:
            late = torch.tensor([float(time.monotonic() - self.waited_s >= deadline)])
            if world.all_sum(late)[0] > 0:
                return "out_of_time"
        if settings.checkpoint_every and step % settings.checkpoint_every == 0:
            self.save()
        if settings.eval_every and step % settings.eval_every == 0:
            training.evaluate_and_emit()
        return None

    def _skipped(self, rows: int) -> None:
        self.skipped_steps += 1
        if self.ledger is not None:
            self.ledger.skipped(self.training.cursor.step, rows)

    def save(self, force: bool = False) -> None:
        """The ledger's ``trained`` record, then the checkpoint, then (--consume) the finished chunks."""
        cursor = self.training.cursor
        if cursor.step == self.saved_step and not force:
            if self.settings.follow_consume:
                self._consume()  # chunks the saved step finished (none new to checkpoint)
            return
        pending = self.window.take_pending()  # passes of taken steps only: they moved the step
        if cursor.step != self.saved_step:
            self.saves += 1
            if self.ledger is not None:
                self.ledger.trained(cursor.step, pending, save=self.saves)
                _kill_point("final" if force else "trained", self.kill_counts)
            self.training.extra_state = {"follow": {
                "passes_total": self.window.passes_total(), "rows_seen": self.window.rows_seen,
                "warmup": self.budget.warmup if self.budget else None, "saves": self.saves}}
            self.training.checkpoint()
            _kill_point("checkpoint", self.kill_counts)
            self.saved_step = cursor.step
        if self.settings.follow_consume:
            self._consume()

    def _consume(self) -> None:
        for state in self.window.finished_chunks():
            if self.pending_rows_of(state):
                continue
            state.consumed = True
            self.consumed_bytes += state.rows.train_bytes
            self.consumed_rows += len(state.rows.train)
            if self.ledger is not None:
                chunk = state.rows
                self.ledger.consumed(chunk.name, len(chunk.train), chunk.train_bytes)
                _kill_point("consumed", self.kill_counts)
                delete_rows(chunk.train)
                self.deleted_rows += len(chunk.train)
        self.world.barrier()

    def pending_rows_of(self, state: Any) -> bool:
        """Whether a chunk's rows hold passes not yet in the ledger (then it waits for the next save)."""
        return any(r.row in self.window.pending for r in state.rows.train)


def _masked(batch: Batch) -> Batch:
    """A rank with no row this step trains on a copy of another rank's row with its loss masked
    out (weight 0), so every rank takes the step together; the row is not counted for it."""
    batch.loss_mask.zero_()
    return Batch(batch.aux, batch.next_ids, batch.target_hidden, batch.loss_mask, [], 0)

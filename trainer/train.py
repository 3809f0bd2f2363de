"""The EAGLE-3 training: TTT unroll, soft cross-entropy, AdamW + warmup/cosine, DDP, exact resume.

This module sets a training up (data index, drafter, optimizer, where a resumed run was); the step
loop, checkpoints, evaluation and the ending are trainer/loop.py. The objective is
trainer/objective.py; rank and world, the heartbeat, the schedule and the RNG state are
trainer/runtime.py.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import torch

from hsmon.contracts import events as ev
from hsmon.contracts import stop_signals, train_defaults, writer_lock
from hsmon.contracts.nofollow import LinkRefused
from trainer.checkpoint import (
    CheckpointRefused,
    checkpoint_step,
    latest_checkpoint,
    load_checkpoint,
    remove_checkpoints,
)
from trainer.data import (
    INDEX_NAME,
    DataError,
    DataIndex,
    RowRef,
    build_index,
    load_index,
    plan_epoch,
    save_index,
)
from trainer.drafter_setup import aux_layer_ids, build_drafter, optimization, restore
from trainer.loop import Cursor, Training
from trainer.nonfinite import (
    check_bad_fraction,
    rows_text,
)
from trainer.runtime import Dist, StopRequest
from trainer.settings import TrainSettings
from trainer.train_line import TrainLine

LOAD_DELAY_ENV = "HSMON_TRAIN_LOAD_DELAY_S"  # read by tests only (docs/development.md, "Signals mid-run")


def _prepare_index(settings: TrainSettings, world: Dist) -> DataIndex:
    """Rank 0 scans the data (or reuses the scan of the run it resumes); others read its result."""
    path = settings.out / INDEX_NAME
    if world.main:
        settings.out.mkdir(parents=True, exist_ok=True)
        if not (settings.resume and path.is_file()):
            save_index(build_index(settings.data_dir, settings.max_length), path)
    world.barrier()
    return load_index(path)


def train(settings: TrainSettings, body: Any = None) -> int:
    """Run (or resume) a training; returns the process exit code. ``body`` replaces the offline
    set-up and loop (`hsmon train --follow`: trainer/follow.py), with the same signals and events."""
    world = Dist()
    locks: list[writer_lock.WriterLock] = []
    try:
        if world.main:
            locks = hold_outputs(settings)
        if not settings.follow:
            restart_over_checkpoint(settings, world)
    except (DataError, CheckpointRefused):
        for lock in locks:
            lock.release()
        world.close()
        raise
    writer = ev.EventWriter(settings.job, settings.events) if world.main else None
    line = TrainLine() if writer is not None else None
    if line is not None and writer is not None:
        writer.listeners.append(line.event)  # a progress line on a terminal, from the events
    stop_requested = StopRequest()

    def on_signal(signum: int, _frame: Any) -> None:
        if not stop_requested.is_set():  # the first signal names the stop (Ctrl-C, then a forwarded SIGTERM)
            stop_requested.signum = signum
        stop_requested.set()

    previous = stop_signals.install(on_signal)  # SIGINT, SIGTERM, SIGHUP (a lost terminal)
    finished = False
    try:
        code = (body or _train)(settings, world, writer, stop_requested)
        finished = True
        return code
    except (DataError, ValueError) as exc:
        if writer:
            writer.emit(ev.ERROR, message=str(exc))
        raise
    finally:
        stop_signals.restore(previous)
        if line is not None:
            line.close()
        if writer:
            writer.close()
        world.close(finished)
        for lock in locks:
            lock.release()


def restart_over_checkpoint(settings: TrainSettings, world: Dist) -> None:
    """--restart: the checkpoints of --out removed first, under its lock (trainer/cli.py refuses a
    run over a checkpoint without --resume or --restart before torch loads)."""
    found = latest_checkpoint(settings.out)
    if found is None or settings.resume or not settings.restart:
        return
    world.barrier()  # every rank has seen it before rank 0 removes it
    if world.main:
        removed = remove_checkpoints(settings.out)
        print(f"hsmon train: --restart: removed {removed} checkpoint(s) of {settings.out} (up to step "
              f"{checkpoint_step(found)}); starting at step 0", file=sys.stderr, flush=True)
    world.barrier()


def hold_outputs(settings: TrainSettings) -> list[writer_lock.WriterLock]:
    """One writer per output (hsmon/contracts/writer_lock.py): --out for the run's life, and the
    spool a following trainer consumes (one consumer deletes from it); a second is refused with a
    `DataError` naming the first's PID and host."""
    held: list[writer_lock.WriterLock] = []
    wanted = [(settings.out, writer_lock.TRAIN_LOCK, "--out")]
    if settings.follow:
        wanted.append((settings.data_dir, writer_lock.FOLLOW_LOCK, "spool (DATA_DIR)"))
    try:
        for directory, name, flag in wanted:
            held.append(writer_lock.acquire(directory, name, "hsmon train", flag))
    except (writer_lock.OutputLocked, LinkRefused) as exc:
        for lock in held:
            lock.release()
        raise DataError(str(exc.strerror if isinstance(exc, LinkRefused) else exc)) from None
    return held


def _train(
    settings: TrainSettings, world: Dist, writer: ev.EventWriter | None, stop_requested: threading.Event
) -> int:
    if delay := float(os.environ.get(LOAD_DELAY_ENV) or 0):
        stop_requested.wait(delay)  # tests: a loading phase that lasts, whatever the machine
    resume_from = latest_checkpoint(settings.out) if settings.resume else None
    ckpt = load_checkpoint(resume_from) if resume_from else None
    index = _prepare_index(settings, world)
    check_bad_fraction(settings.data_dir, index.nonfinite_rows, len(index.rows), settings.max_bad_fraction)
    if index.nonfinite_rows and world.main:
        print(
            f"hsmon train: skipping {len(index.nonfinite_rows)} rows that hold NaN/Inf hidden states "
            f"(rows {rows_text(index.nonfinite_rows)})",
            file=sys.stderr,
            flush=True,
        )
    train_rows, held_rows = index.split(settings.eval_fraction)
    drafter, cfg, target_head = build_drafter(settings, index, ckpt, world.device)
    steps_per_epoch, total_steps = _step_budget(settings, train_rows, world)
    forward, params, optimizer, scheduler = optimization(settings, drafter, world, total_steps)
    cursor = Cursor()
    if ckpt is not None:
        cursor = restore(ckpt, resume_from, world, optimizer, scheduler)
    training = Training(
        settings=settings,
        world=world,
        writer=writer,
        stop_requested=stop_requested,
        drafter=drafter,
        cfg=cfg,
        forward=forward,
        params=params,
        optimizer=optimizer,
        scheduler=scheduler,
        target_head=target_head,
        draft_ids=torch.nonzero(drafter.t2d, as_tuple=False).flatten(),
        train_rows=train_rows,
        held_rows=held_rows,
        steps_per_epoch=steps_per_epoch,
        total_steps=total_steps,
        aux_layer_ids=aux_layer_ids(settings.data_dir),
        cursor=cursor,
        nonfinite_rows=len(index.nonfinite_rows),
    )
    if writer:
        writer.emit(
            ev.START, backend="train", pid=os.getpid(), output_dir=str(settings.out), log=ev.own_log(),
            data_dir=str(settings.data_dir), target_model=str(settings.target), total_rows=len(train_rows),
            eval_rows=len(held_rows), total_tokens=sum(r.length for r in train_rows),
            nonfinite_rows=len(index.nonfinite_rows), nonfinite_row_ids=index.nonfinite_rows[:20],
            hidden_size=cfg.hidden_size, layers=index.num_aux, draft_vocab_size=cfg.draft_vocab_size,
            arch=cfg.arch, ttt_length=settings.ttt_length, total_steps=total_steps,
            steps_per_epoch=steps_per_epoch,
            world_size=world.world, resumed_from=str(resume_from) if resume_from else None,
            start_step=cursor.step, dtype="bfloat16" if training.autocast else "float32",
            device=world.device.type, process_started_ts=ev.process_started(),
        )  # fmt: skip
    return training.run(checkpointed=ckpt is not None)


def _step_budget(settings: TrainSettings, train_rows: list[RowRef], world: Dist) -> tuple[int, int]:
    """(steps per epoch for each rank, total steps) from the data, --epochs and --max-steps."""
    steps_per_epoch = len(plan_epoch(train_rows, settings.batch_tokens, settings.seed, 0)) // world.world
    if steps_per_epoch == 0:
        raise DataError(
            f"{settings.data_dir}: {len(train_rows)} training rows make fewer batches than "
            f"{world.world} processes; lower --batch-tokens or add data"
        )
    if settings.max_steps is not None:
        epochs_bound = settings.epochs * steps_per_epoch if settings.epochs else None
        total_steps = settings.max_steps if epochs_bound is None else min(settings.max_steps, epochs_bound)
    else:
        total_steps = (settings.epochs or train_defaults.EPOCHS) * steps_per_epoch
    return steps_per_epoch, total_steps


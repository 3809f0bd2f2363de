"""The EAGLE-3 training: TTT unroll, soft cross-entropy, AdamW + warmup/cosine, DDP, exact resume.

This module sets a training up (data index, drafter, optimizer, where a resumed run was); the step
loop, checkpoints, evaluation and the ending are trainer/loop.py. The objective is
trainer/objective.py; rank and world, the heartbeat, the schedule and the RNG state are
trainer/runtime.py.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import torch

from hsmon.contracts import events as ev
from hsmon.contracts import writer_lock
from hsmon.contracts.capture_points import sglang_layer_ids
from trainer.checkpoint import latest_checkpoint, load_checkpoint
from trainer.data import (
    INDEX_NAME,
    DataError,
    DataIndex,
    RowRef,
    build_draft_vocab,
    build_index,
    load_index,
    plan_epoch,
    save_index,
)
from trainer.loop import Cursor, Training
from trainer.model import DEFAULT_ARCH, DrafterConfig, Eagle3Drafter
from trainer.nonfinite import (
    check_bad_fraction,
    rows_text,
)
from trainer.objective import TTTForward
from trainer.runtime import Dist, StopRequest, lr_lambda_factory, set_rng_state
from trainer.settings import TrainSettings
from trainer.target import load_embed_and_head, load_target_config


def _prepare_index(settings: TrainSettings, world: Dist) -> DataIndex:
    """Rank 0 scans the data (or reuses the scan of the run it resumes); others read its result."""
    path = settings.out / INDEX_NAME
    if world.main:
        settings.out.mkdir(parents=True, exist_ok=True)
        if not (settings.resume and path.is_file()):
            save_index(build_index(settings.data_dir, settings.max_length), path)
    world.barrier()
    return load_index(path)


def _aux_layer_ids(data_dir: Path) -> list[int] | None:
    """SGLang layer ids of the capture points, when the extraction's manifest records them."""
    from hsmon.contracts.manifest_reader import read_manifest

    for run in reversed(read_manifest(data_dir).runs):
        settings = run.get("settings") if isinstance(run.get("settings"), dict) else {}
        layers = settings.get("layers") or run.get("layers")
        if isinstance(layers, list) and all(isinstance(x, int) for x in layers):
            return sglang_layer_ids(layers)
    return None


def train(settings: TrainSettings, body: Any = None) -> int:
    """Run (or resume) a training; returns the process exit code. ``body`` replaces the offline
    set-up and loop (`hsmon train --follow`: trainer/follow.py), with the same signals and events."""
    world = Dist()
    try:
        locks = hold_outputs(settings) if world.main else []
    except DataError:
        world.close()
        raise
    writer = ev.EventWriter(settings.job, settings.events) if world.main else None
    stop_requested = StopRequest()

    def on_signal(signum: int, _frame: Any) -> None:
        stop_requested.signum = signum
        stop_requested.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
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
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if writer:
            writer.close()
        world.close(finished)
        for lock in locks:
            lock.release()


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
    except writer_lock.OutputLocked as exc:
        for lock in held:
            lock.release()
        raise DataError(str(exc)) from None
    return held


def _train(
    settings: TrainSettings, world: Dist, writer: ev.EventWriter | None, stop_requested: threading.Event
) -> int:
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
    drafter, cfg, target_head = _build_drafter(settings, index, ckpt, world.device)
    steps_per_epoch, total_steps = _step_budget(settings, train_rows, world)
    forward, params, optimizer, scheduler = _optimization(settings, drafter, world, total_steps)
    cursor = Cursor()
    if ckpt is not None:
        cursor = _restore(ckpt, resume_from, world, optimizer, scheduler)
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
        aux_layer_ids=_aux_layer_ids(settings.data_dir),
        cursor=cursor,
        nonfinite_rows=len(index.nonfinite_rows),
    )
    if writer:
        writer.emit(
            ev.START, backend="train", pid=os.getpid(), output_dir=str(settings.out),
            data_dir=str(settings.data_dir), target_model=str(settings.target), total_rows=len(train_rows),
            eval_rows=len(held_rows), total_tokens=sum(r.length for r in train_rows),
            nonfinite_rows=len(index.nonfinite_rows), nonfinite_row_ids=index.nonfinite_rows[:20],
            hidden_size=cfg.hidden_size, layers=index.num_aux, draft_vocab_size=cfg.draft_vocab_size,
            arch=cfg.arch, ttt_length=settings.ttt_length, total_steps=total_steps,
            steps_per_epoch=steps_per_epoch,
            world_size=world.world, resumed_from=str(resume_from) if resume_from else None,
            start_step=cursor.step, dtype="bfloat16" if training.autocast else "float32",
            device=world.device.type,
        )  # fmt: skip
    return training.run(checkpointed=ckpt is not None)


def _build_drafter(
    settings: TrainSettings, index: DataIndex, ckpt: dict[str, Any] | None, device: torch.device
) -> tuple[Eagle3Drafter, DrafterConfig, torch.Tensor]:
    """The drafter (from its checkpoint, or new with a draft vocabulary from the data's token
    counts), its config, and the target's LM head, on ``device``."""
    target_config = load_target_config(settings.target)
    embed, head = load_embed_and_head(settings.target)
    if embed.shape[1] != index.hidden_size:
        raise DataError(
            f"{settings.data_dir}: hidden size {index.hidden_size} differs from the target's "
            f"{embed.shape[1]} ({settings.target}); pass the --target-model the data came from"
        )
    if ckpt is not None:
        cfg = DrafterConfig(**ckpt["drafter_config"])
        if settings.arch is not None and settings.arch != cfg.arch:
            raise DataError(
                f"{settings.out}: the checkpoint trains a {cfg.arch} drafter, --arch asks for "
                f"{settings.arch}; resume without --arch (or --arch {cfg.arch}), or train into a new --out"
            )
    else:
        cfg = DrafterConfig.from_target_config(target_config, 0, index.num_aux)
        cfg.set_arch(settings.arch or DEFAULT_ARCH)
        d2t, t2d = build_draft_vocab(index.token_counts, cfg.vocab_size, settings.draft_vocab_size)
        cfg.draft_vocab_size = int(d2t.shape[0])
    torch.manual_seed(settings.seed)
    random.seed(settings.seed)
    drafter = Eagle3Drafter(cfg)
    with torch.no_grad():
        drafter.embed_tokens.weight.copy_(embed)
    if ckpt is None:
        drafter.set_vocab(d2t, t2d)
    else:
        drafter.load_state_dict(ckpt["model"], strict=False)
    drafter.to(device)
    return drafter, cfg, head.to(device)


def _optimization(settings: TrainSettings, drafter: torch.nn.Module, world: Dist, total_steps: int
                  ) -> tuple[torch.nn.Module, list[torch.nn.Parameter], torch.optim.Optimizer, Any]:
    """The TTT forward (DDP-wrapped on several ranks), the trained parameters, AdamW and its
    warm-up-then-decay schedule: the same for an offline and a following training."""
    forward: torch.nn.Module = TTTForward(drafter)
    if world.enabled:
        forward = torch.nn.parallel.DistributedDataParallel(
            forward, device_ids=[world.device.index] if world.device.type == "cuda" else None
        )
    params = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=settings.lr, betas=(0.9, 0.95), weight_decay=settings.weight_decay
    )
    warmup = max(1, int(settings.warmup_ratio * total_steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda_factory(total_steps, warmup, settings.min_lr_ratio)
    )
    return forward, params, optimizer, scheduler


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
        total_steps = (settings.epochs or 1) * steps_per_epoch
    return steps_per_epoch, total_steps


def _restore(
    ckpt: dict[str, Any],
    resume_from: Path | None,
    world: Dist,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
) -> Cursor:
    """Load the optimizer, the schedule and this rank's RNG from a checkpoint; where it stopped."""
    if ckpt["world_size"] != world.world:
        raise DataError(
            f"{resume_from}: written by {ckpt['world_size']} processes, resumed with "
            f"{world.world}; resume with the same --nproc_per_node"
        )
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    set_rng_state(ckpt["rng"][world.rank] if isinstance(ckpt["rng"], list) else ckpt["rng"])
    return Cursor(
        step=ckpt["step"], epoch=ckpt["epoch"], position=ckpt["position"], tokens=ckpt.get("tokens", 0)
    )

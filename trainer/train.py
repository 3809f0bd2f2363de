"""The EAGLE-3 training loop: TTT unroll, soft cross-entropy, AdamW + warmup/cosine, DDP, exact resume.

The objective is trainer/objective.py; rank and world, the heartbeat, the schedule and the RNG
state are trainer/runtime.py.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hsmon import events as ev
from trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from trainer.data import (
    INDEX_NAME,
    DataError,
    DataIndex,
    Prefetcher,
    RowRef,
    build_draft_vocab,
    build_index,
    load_index,
    plan_epoch,
    save_index,
)
from trainer.model import DrafterConfig, Eagle3Drafter
from trainer.nonfinite import (
    DEFAULT_MAX_BAD_FRACTION,
    DEFAULT_MAX_SKIPS_IN_A_ROW,
    LossGuard,
    backward_unless_nonfinite,
    check_bad_fraction,
    rows_text,
    skip_step,
)
from trainer.objective import StepStats, TTTForward, step_stats, ttt_loss
from trainer.runtime import Dist, Heartbeat, lr_lambda_factory, ranks_in_sync, rng_state, set_rng_state
from trainer.target import load_embed_and_head, load_target_config


@dataclass
class TrainSettings:
    data_dir: Path
    target: Path
    out: Path
    epochs: int | None = None
    max_steps: int | None = None
    ttt_length: int = 7
    draft_vocab_size: int | None = None
    lr: float = 1e-4
    batch_tokens: int = 4096
    events: str | None = None
    resume: bool = False
    warmup_ratio: float = 0.03
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    max_length: int | None = 2048
    eval_fraction: float = 0.05
    eval_every: int = 0
    eval_batches: int = 50
    checkpoint_every: int = 1000
    keep_checkpoints: int = 2
    log_every: int = 1
    heartbeat_s: float = 10.0
    seed: int = 0
    time_limit_s: float | None = None
    job: str = "train"
    max_bad_fraction: float = DEFAULT_MAX_BAD_FRACTION
    max_skips_in_a_row: int = DEFAULT_MAX_SKIPS_IN_A_ROW
    extra: dict[str, Any] = field(default_factory=dict)


def _prepare_index(settings: TrainSettings, world: Dist) -> DataIndex:
    """Rank 0 scans the data (or reuses the scan of the run it resumes); others read its result."""
    path = settings.out / INDEX_NAME
    if world.main:
        settings.out.mkdir(parents=True, exist_ok=True)
        if not (settings.resume and path.is_file()):
            save_index(build_index(settings.data_dir, settings.max_length), path)
    world.barrier()
    return load_index(path)


def _evaluate(
    drafter: Eagle3Drafter,
    rows: list[RowRef],
    settings: TrainSettings,
    target_head: torch.Tensor,
    draft_ids: torch.Tensor,
    device: torch.device,
    autocast: bool,
) -> StepStats | None:
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


def _aux_layer_ids(data_dir: Path) -> list[int] | None:
    """SGLang layer ids of the capture points, when the extraction's manifest records them."""
    from hsmon.manifest_reader import read_manifest

    for run in reversed(read_manifest(data_dir).runs):
        settings = run.get("settings") if isinstance(run.get("settings"), dict) else {}
        layers = settings.get("layers") or run.get("layers")
        if isinstance(layers, list) and all(isinstance(x, int) for x in layers):
            return [x - 1 for x in layers]  # capture point p is SGLang's layer id p - 1
    return None


def train(settings: TrainSettings) -> int:
    """Run (or resume) a training; returns the process exit code."""
    world = Dist()
    writer = ev.EventWriter(settings.job, settings.events) if world.main else None
    stop_requested = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stop_requested.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    finished = False
    try:
        code = _train(settings, world, writer, stop_requested)
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


def _train(
    settings: TrainSettings, world: Dist, writer: ev.EventWriter | None, stop_requested: threading.Event
) -> int:
    device = world.device
    autocast = device.type == "cuda"
    out = settings.out
    resume_from = latest_checkpoint(out) if settings.resume else None
    ckpt = load_checkpoint(resume_from) if resume_from else None

    index = _prepare_index(settings, world)
    check_bad_fraction(settings.data_dir, index.nonfinite_rows, len(index.rows), settings.max_bad_fraction)
    if index.nonfinite_rows and world.main:
        print(f"hsmon train: skipping {len(index.nonfinite_rows)} rows that hold NaN/Inf hidden states "
              f"(rows {rows_text(index.nonfinite_rows)})", file=sys.stderr, flush=True)
    train_rows, held_rows = index.split(settings.eval_fraction)
    target_config = load_target_config(settings.target)
    embed, head = load_embed_and_head(settings.target)
    if embed.shape[1] != index.hidden_size:
        raise DataError(
            f"{settings.data_dir}: hidden size {index.hidden_size} differs from the target's "
            f"{embed.shape[1]} ({settings.target}); pass the --target-model the data came from"
        )
    if ckpt is not None:
        cfg = DrafterConfig(**ckpt["drafter_config"])
    else:
        counts = index.token_counts
        cfg = DrafterConfig.from_target_config(target_config, 0, index.num_aux)
        d2t, t2d = build_draft_vocab(counts, cfg.vocab_size, settings.draft_vocab_size)
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
    target_head = head.to(device)
    draft_ids = torch.nonzero(drafter.t2d, as_tuple=False).flatten()

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
    warmup = max(1, int(settings.warmup_ratio * total_steps))

    forward: torch.nn.Module = TTTForward(drafter)
    if world.enabled:
        forward = torch.nn.parallel.DistributedDataParallel(
            forward, device_ids=[device.index] if device.type == "cuda" else None
        )
    params = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=settings.lr, betas=(0.9, 0.95), weight_decay=settings.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda_factory(total_steps, warmup, settings.min_lr_ratio)
    )

    step, epoch, position, tokens_done = 0, 0, 0, 0
    if ckpt is not None:
        if ckpt["world_size"] != world.world:
            raise DataError(
                f"{resume_from}: written by {ckpt['world_size']} processes, resumed with "
                f"{world.world}; resume with the same --nproc_per_node"
            )
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        step, epoch, position = ckpt["step"], ckpt["epoch"], ckpt["position"]
        tokens_done = ckpt.get("tokens", 0)
        set_rng_state(ckpt["rng"][world.rank] if isinstance(ckpt["rng"], list) else ckpt["rng"])

    aux_layer_ids = _aux_layer_ids(settings.data_dir)
    counters: dict[str, Any] = {"step": step, "tokens": tokens_done, "total_steps": total_steps}
    heartbeat = Heartbeat(writer, settings.heartbeat_s, counters)

    def checkpoint() -> Path | None:
        rng = [rng_state()]
        if world.enabled:
            gathered: list[Any] = [None] * world.world
            dist.all_gather_object(gathered, rng[0])
            rng = gathered
        path = None
        if world.main:
            state = {
                "model": {k: v for k, v in drafter.state_dict().items() if not k.startswith("embed_tokens.")},
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "step": step,
                "epoch": epoch,
                "position": position,
                "tokens": tokens_done,
                "rng": rng,
                "world_size": world.world,
                "drafter_config": cfg.to_dict(),
                "aux_layer_ids": aux_layer_ids,
                "target_model": str(settings.target),
                "total_steps": total_steps,
            }
            path = save_checkpoint(out, step, state, settings.keep_checkpoints)
            writer.emit(ev.CHECKPOINT, step=step, path=str(path), epoch=epoch)
        world.barrier()
        return path

    if writer:
        writer.emit(
            ev.START,
            backend="train",
            pid=os.getpid(),
            output_dir=str(out),
            data_dir=str(settings.data_dir),
            target_model=str(settings.target),
            total_rows=len(train_rows),
            eval_rows=len(held_rows),
            total_tokens=sum(r.length for r in train_rows),
            nonfinite_rows=len(index.nonfinite_rows),
            nonfinite_row_ids=index.nonfinite_rows[:20],
            hidden_size=cfg.hidden_size,
            layers=index.num_aux,
            draft_vocab_size=cfg.draft_vocab_size,
            ttt_length=settings.ttt_length,
            total_steps=total_steps,
            steps_per_epoch=steps_per_epoch,
            world_size=world.world,
            resumed_from=str(resume_from) if resume_from else None,
            start_step=step,
            dtype="bfloat16" if autocast else "float32",
            device=device.type,
        )

    last_ckpt_step = step if ckpt is not None else -1
    guard = LossGuard(settings.max_skips_in_a_row)
    run_started = time.monotonic()
    out_of_time = False
    interval_start, interval_tokens, interval_wait = time.perf_counter(), 0, 0.0
    stopped = False
    while step < total_steps and not stopped and not out_of_time:
        plan = plan_epoch(train_rows, settings.batch_tokens, settings.seed, epoch)
        mine = [plan[s * world.world + world.rank] for s in range(steps_per_epoch)]
        prefetch = Prefetcher([[train_rows[i] for i in b] for b in mine[position:]])
        waited = 0.0
        try:
            for batch in prefetch:
                interval_wait += prefetch.wait_seconds - waited
                waited = prefetch.wait_seconds
                optimizer.zero_grad(set_to_none=True)
                loss, sums = ttt_loss(
                    forward, batch, target_head, draft_ids, settings.ttt_length, device, autocast
                )
                what, grad_norm = backward_unless_nonfinite(loss, params, settings.grad_clip, world)
                if what:
                    position += 1
                    if position >= steps_per_epoch:
                        epoch, position = epoch + 1, 0
                    skip_step(guard, writer, step, batch.rows, what, counters)
                    continue
                guard.ok(step)
                optimizer.step()
                scheduler.step()
                step += 1
                position += 1
                real = torch.tensor([float(batch.real_tokens), 1.0 if stop_requested.is_set() else 0.0])
                world.all_sum(sums)
                world.all_sum(real)
                tokens_done += int(real[0])
                interval_tokens += int(real[0])
                counters.update(step=step, tokens=tokens_done, epoch=epoch)
                if writer and (step % settings.log_every == 0 or step == total_steps):
                    now = time.perf_counter()
                    elapsed = max(now - interval_start, 1e-9)
                    stats = step_stats(sums)
                    writer.emit(
                        ev.STEP,
                        step=step,
                        total_steps=total_steps,
                        epoch=epoch,
                        loss=stats.weighted_loss,
                        losses=stats.losses,
                        accs=stats.accs,
                        lr=scheduler.get_last_lr()[0],
                        grad_norm=float(grad_norm),
                        tokens=tokens_done,
                        tokens_s=interval_tokens / elapsed,
                        data_wait_frac=min(1.0, interval_wait / elapsed),
                        skipped_steps=guard.skipped,
                    )
                    interval_start, interval_tokens, interval_wait = now, 0, 0.0
                if position >= steps_per_epoch:
                    epoch, position = epoch + 1, 0
                if real[1] > 0:
                    stopped = True
                    break
                if settings.time_limit_s is not None:
                    late = torch.tensor([float(time.monotonic() - run_started >= settings.time_limit_s)])
                    if world.all_sum(late)[0] > 0:  # every rank ends at the same step
                        out_of_time = True
                        break
                if settings.checkpoint_every and step % settings.checkpoint_every == 0:
                    checkpoint()
                    last_ckpt_step = step
                if settings.eval_every and step % settings.eval_every == 0:
                    _eval_and_emit(
                        drafter,
                        held_rows,
                        settings,
                        target_head,
                        draft_ids,
                        device,
                        autocast,
                        world,
                        writer,
                        step,
                    )
                if step >= total_steps:
                    break
        finally:
            prefetch.close()
    heartbeat.close()
    if last_ckpt_step != step:
        checkpoint()
    if stopped:
        if writer:
            writer.emit(ev.STOPPED, reason="signal", step=step, tokens=tokens_done)
        return 0
    stats = _eval_and_emit(
        drafter, held_rows, settings, target_head, draft_ids, device, autocast, world, writer, step
    )
    in_sync = ranks_in_sync(drafter, world)
    if writer:
        writer.emit(
            ev.DONE,
            step=step,
            tokens=tokens_done,
            epochs_done=epoch,
            time_limit_reached=out_of_time,
            eval_accs=stats.accs if stats else None,
            skipped_steps=guard.skipped,
            nonfinite_rows=len(index.nonfinite_rows),
            ranks_in_sync=in_sync,
            checkpoint=str(latest_checkpoint(out)),
        )
    return 0


def _eval_and_emit(
    drafter: Eagle3Drafter,
    held_rows: list[RowRef],
    settings: TrainSettings,
    target_head: torch.Tensor,
    draft_ids: torch.Tensor,
    device: torch.device,
    autocast: bool,
    world: Dist,
    writer: ev.EventWriter | None,
    step: int,
) -> StepStats | None:
    stats = None
    if world.main:
        stats = _evaluate(drafter, held_rows, settings, target_head, draft_ids, device, autocast)
        if stats and writer:
            writer.emit(
                ev.EVAL,
                step=step,
                rows=len(held_rows),
                losses=stats.losses,
                accs=stats.accs,
                loss=stats.weighted_loss,
                accept_len_est=expected_accept_length(stats.accs),
            )
    world.barrier()
    return stats


def expected_accept_length(accs: list[float]) -> float:
    """1 + sum over k of the chance that the first k drafted tokens are all right, treating each
    step's accuracy (measured given a right prefix... approximately) as a conditional rate."""
    total, run = 1.0, 1.0
    for acc in accs:
        run *= acc
        total += run
    return total

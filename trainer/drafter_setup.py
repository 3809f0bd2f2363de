"""The set-up an offline and a following training share: the drafter (new or from its checkpoint),
the optimization (TTT forward, AdamW, the schedule), where a resumed run was, and the capture
points' SGLang layer ids from the extraction's manifest."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

from hsmon.contracts.capture_points import sglang_layer_ids
from trainer.data import DataError, DataIndex, build_draft_vocab
from trainer.loop import Cursor
from trainer.model import DEFAULT_ARCH, DrafterConfig, Eagle3Drafter
from trainer.objective import TTTForward
from trainer.runtime import Dist, lr_lambda_factory, set_rng_state
from trainer.settings import TrainSettings
from trainer.target import load_embed_and_head, load_target_config


def aux_layer_ids(data_dir: Path) -> list[int] | None:
    """SGLang layer ids of the capture points, when the extraction's manifest records them."""
    from hsmon.contracts.manifest_reader import read_manifest

    for run in reversed(read_manifest(data_dir).runs):
        settings = run.get("settings") if isinstance(run.get("settings"), dict) else {}
        layers = settings.get("layers") or run.get("layers")
        if isinstance(layers, list) and all(isinstance(x, int) for x in layers):
            return sglang_layer_ids(layers)
    return None


def build_drafter(
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


def optimization(settings: TrainSettings, drafter: torch.nn.Module, world: Dist, total_steps: int
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


def restore(
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

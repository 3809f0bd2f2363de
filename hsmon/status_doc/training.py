"""A training's section (``jobs[].training``, and an online job's ``online.training``): its own
module, so that the job and the online section both hold it."""

from __future__ import annotations

from typing import Any

from msgspec import UNSET, UnsetType

from hsmon.status_doc.base import Num, Section


class TrainingSection(Section):
    """A training's figures, from its ``step``/``checkpoint``/``eval`` events. Values are as the
    trainer wrote them (numbers, or per-unroll-step lists for ``loss``/``acc``); the fields after
    ``eta_s`` are present only when the trainer sends them."""

    step: Any
    epoch: Any
    loss: Any
    acc: Any
    tokens_per_s: Num | None
    last_checkpoint: Any
    eta_s: Any
    total_steps: Any | UnsetType = UNSET
    lr: Any | UnsetType = UNSET
    grad_norm: Any | UnsetType = UNSET
    data_wait_frac: Any | UnsetType = UNSET
    loss_weighted: Any | UnsetType = UNSET
    eval: dict[str, Any] | UnsetType = UNSET

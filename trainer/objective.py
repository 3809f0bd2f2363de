"""The EAGLE-3 training objective: the training-time-test (TTT) unroll's weighted soft cross-entropy.

The loss of unroll step i is the soft cross-entropy between the drafter's distribution over the
draft vocabulary and the target's (recomputed from the stored last hidden state with the target's
frozen lm_head, restricted to the draft vocabulary), over positions whose next token is trained
on and whose target argmax lies in the draft vocabulary; steps are weighted 0.8^i.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trainer.data import Batch
from trainer.model import Eagle3Drafter

STEP_WEIGHT_DECAY = 0.8


@dataclass
class StepStats:
    """Per unroll step: mean loss, accuracy against the target's top token, positions counted."""

    losses: list[float]
    accs: list[float]
    counts: list[float]

    @property
    def weighted_loss(self) -> float:
        """The loss the optimiser minimises: step i weighted ``STEP_WEIGHT_DECAY**i``."""
        return sum(STEP_WEIGHT_DECAY**i * v for i, v in enumerate(self.losses))


def ttt_loss(
    model: Eagle3Drafter,
    batch: Batch,
    target_head: torch.Tensor,
    draft_ids: torch.Tensor,
    length: int,
    device: torch.device,
    autocast: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted loss (scalar) and per-step sums [3, length]: (loss*count, correct, count)."""
    aux = batch.aux.to(device, non_blocking=True)
    next_ids = batch.next_ids.to(device)
    mask = batch.loss_mask.to(device)
    seq = next_ids.shape[1]
    with torch.no_grad():
        target_logits = batch.target_hidden.to(device) @ target_head.T  # [B, T, V]
        in_draft = model_vocab_mask(model)[target_logits.argmax(-1)]
        target_p = torch.softmax(target_logits[..., draft_ids].float(), dim=-1)
        target_top = target_p.argmax(-1)
        valid = mask * in_draft.float()
        pad = length - 1
        ids_padded = F.pad(next_ids, (0, pad))
        p_padded = F.pad(target_p, (0, 0, 0, pad))
        top_padded = F.pad(target_top, (0, pad))
        valid_padded = F.pad(valid, (0, pad))
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        logits = model(aux, ids_padded, length)
    total = torch.zeros((), device=device)
    sums = torch.zeros(3, length, device=device)
    for i, step_logits in enumerate(logits):
        p = p_padded[:, i : i + seq]
        m = valid_padded[:, i : i + seq]
        logp = torch.log_softmax(step_logits.float(), dim=-1)
        ce = -(p * logp).sum(-1)
        count = m.sum()
        loss_i = (ce * m).sum() / count.clamp(min=1.0)
        total = total + (STEP_WEIGHT_DECAY**i) * loss_i
        with torch.no_grad():
            correct = ((step_logits.argmax(-1) == top_padded[:, i : i + seq]).float() * m).sum()
            sums[0, i] = loss_i.detach() * count
            sums[1, i] = correct
            sums[2, i] = count
    return total, sums


def model_vocab_mask(model: torch.nn.Module) -> torch.Tensor:
    inner = model.module if hasattr(model, "module") else model
    return inner.t2d


class TTTForward(torch.nn.Module):
    """Wraps the drafter so that DDP sees one forward call per step."""

    def __init__(self, drafter: Eagle3Drafter) -> None:
        super().__init__()
        self.drafter = drafter

    @property
    def t2d(self) -> torch.Tensor:
        return self.drafter.t2d

    def forward(self, aux: torch.Tensor, next_ids: torch.Tensor, length: int) -> list[torch.Tensor]:
        return self.drafter.ttt_logits(aux, next_ids, length)


def step_stats(sums: torch.Tensor) -> StepStats:
    """Per-step mean loss and accuracy, and counts, from the sums ``ttt_loss`` returns."""
    counts = sums[2].clamp(min=1.0)
    return StepStats((sums[0] / counts).tolist(), (sums[1] / counts).tolist(), sums[2].tolist())

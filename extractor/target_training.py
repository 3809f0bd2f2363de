"""The embedded target's model and its training: a small Llama started from a low-rank bigram model,
trained on CPU for a time budget (the learning-rate schedule follows elapsed time), and the
losses that judge it (model, unigram and bigram cross-entropy on held-out tokens)."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from extractor.target_text import BOS, EOS, PAD


@dataclass(frozen=True)
class TargetSpec:
    """Shape and training settings of the embedded target."""

    vocab_size: int = 2048
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 8
    num_heads: int = 4
    num_kv_heads: int = 2
    max_positions: int = 2048
    seq_len: int = 256
    batch_size: int = 4
    learning_rate: float = 5e-3
    warmup_steps: int = 10
    tokenizer_chars: int = 3_000_000
    train_chars: int = 4_000_000
    chat_chars: int = 600_000
    bigram_prior: float = 20.0
    eval_tokens: int = 8192


# ---------------------------------------------------------------------------------------------
# Losses.


def unigram_loss(train_ids: Sequence[int], eval_ids: Sequence[int], vocab_size: int) -> float:
    """Cross-entropy (nats/token) on ``eval_ids`` of an add-one unigram model fit on ``train_ids``."""
    counts = [1.0] * vocab_size
    for token in train_ids:
        counts[token] += 1.0
    total = sum(counts)
    return -sum(math.log(counts[token] / total) for token in eval_ids) / max(1, len(eval_ids))


def model_loss(model: Any, ids: Sequence[int], seq_len: int, batch_size: int = 8) -> float:
    """Mean next-token cross-entropy (nats/token) of ``model`` over ``ids`` cut into ``seq_len`` windows."""
    import torch

    windows = [list(ids[i : i + seq_len]) for i in range(0, len(ids) - 1, seq_len)]
    windows = [w for w in windows if len(w) >= 2]
    total_loss = 0.0
    total_tokens = 0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for start in range(0, len(windows), batch_size):
            group = windows[start : start + batch_size]
            # Windows of one length share a batch; only the last window may be shorter.
            for same in (group[:-1], group[-1:]) if len(group[-1]) != len(group[0]) else (group,):
                if not same:
                    continue
                batch = torch.tensor(same)
                logits = model(input_ids=batch).logits[:, :-1].float()
                loss = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="sum"
                )
                total_loss += float(loss)
                total_tokens += batch[:, 1:].numel()
    model.train(was_training)
    return total_loss / max(1, total_tokens)


def predicted_positions(ids: Sequence[int], seq_len: int) -> list[int]:
    """The ids that `model_loss` scores (every window's tokens but its first), for a fair unigram."""
    scored: list[int] = []
    for i in range(0, len(ids) - 1, seq_len):
        window = ids[i : i + seq_len]
        if len(window) >= 2:
            scored.extend(window[1:])
    return scored


# ---------------------------------------------------------------------------------------------
# Model.


def make_config(spec: TargetSpec, tokenizer: Any) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_positions,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        # Untied: the input embedding and the output head start from the two factors of a
        # low-rank bigram model (see `bigram_init`).
        tie_word_embeddings=False,
        bos_token_id=tokenizer.token_to_id(BOS),
        eos_token_id=tokenizer.token_to_id(EOS),
        pad_token_id=tokenizer.token_to_id(PAD),
        torch_dtype="float32",
    )


def bigram_init(model: Any, stream: Sequence[int], vocab_size: int, prior: float) -> None:
    """Start the model as a low-rank bigram model of ``stream``.

    A randomly initialised model spends most of a short CPU budget learning what a count
    table knows at once; starting from it, training goes straight to using context. The
    centred log-probabilities of a bigram model (smoothed towards the unigram, Dirichlet
    ``prior``) are factored by a truncated SVD: the left factor, rows scaled to RMS 1 as the
    final RMSNorm will see them, becomes the input embedding; the output head is then the
    least-squares fit of the log-probabilities on it.
    """
    import torch

    ids = torch.as_tensor(stream, dtype=torch.long)
    counts = torch.bincount(ids[:-1] * vocab_size + ids[1:], minlength=vocab_size * vocab_size)
    counts = counts.reshape(vocab_size, vocab_size).double()
    unigram = counts.sum(0) + 1.0
    unigram /= unigram.sum()
    logp = ((counts + prior * unigram) / (counts.sum(1, keepdim=True) + prior)).log()
    logp -= logp.mean(1, keepdim=True)
    hidden = model.get_input_embeddings().weight.shape[1]
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(0)
    left, singular, _ = torch.svd_lowrank(logp, q=hidden + 16, niter=4)
    torch.random.set_rng_state(generator_state)
    embed = left[:, :hidden] * singular[:hidden].sqrt()
    embed /= embed.pow(2).mean(1, keepdim=True).sqrt().clamp_min(1e-6)
    head = torch.linalg.lstsq(embed, logp).solution.T
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(embed.float())
        model.get_output_embeddings().weight.copy_(head.float())


def bigram_loss(
    train_ids: Sequence[int], eval_ids: Sequence[int], seq_len: int, vocab_size: int, prior: float
) -> float:
    """Cross-entropy (nats/token) of the smoothed bigram model `bigram_init` starts from.

    Scored on the positions `model_loss` scores: within each ``seq_len`` window of ``eval_ids``.
    """
    import torch

    ids = torch.as_tensor(train_ids, dtype=torch.long)
    counts = torch.bincount(ids[:-1] * vocab_size + ids[1:], minlength=vocab_size * vocab_size)
    counts = counts.reshape(vocab_size, vocab_size).double()
    unigram = counts.sum(0) + 1.0
    unigram /= unigram.sum()
    probs = (counts + prior * unigram) / (counts.sum(1, keepdim=True) + prior)
    prev: list[int] = []
    nxt: list[int] = []
    for i in range(0, len(eval_ids) - 1, seq_len):
        window = list(eval_ids[i : i + seq_len])
        prev += window[:-1]
        nxt += window[1:]
    return float(-probs[torch.tensor(prev), torch.tensor(nxt)].log().mean())


def auto_threads(limit: int = 2) -> int:
    """Up to ``limit`` torch threads, fewer when other work already fills the cores.

    On a busy machine two threads that wait on each other at every operation run several
    times slower than one (measured: 570 vs 3600 tokens/s at load 4 on 2 cores).
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    idle = cores - os.getloadavg()[0]
    return max(1, min(limit, cores, int(idle + 0.5)))


def _lr_at(step: int, progress: float, spec: TargetSpec) -> float:
    """Linear warm-up by step, then cosine decay to 10 % by elapsed fraction of the time budget."""
    warm = min(1.0, (step + 1) / spec.warmup_steps)
    decay = 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return spec.learning_rate * warm * decay


def train_model(
    model: Any, stream: Sequence[int], spec: TargetSpec, seconds: float, seed: int
) -> tuple[int, int]:
    """Train ``model`` on random windows of ``stream`` until ``seconds`` pass; (steps, tokens seen)."""
    import torch

    data = torch.tensor(stream, dtype=torch.long)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=spec.learning_rate, betas=(0.9, 0.95), weight_decay=0.01
    )
    model.train()
    start = time.monotonic()
    steps = 0
    max_start = len(data) - spec.seq_len - 1
    if max_start <= 0:
        raise RuntimeError("training stream shorter than one window; the corpus is too small")
    while True:
        progress = (time.monotonic() - start) / seconds if seconds > 0 else 1.0
        if progress >= 1.0 and steps > 0:
            break
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(steps, progress, spec)
        offsets = torch.randint(0, max_start, (spec.batch_size,), generator=generator)
        batch = torch.stack([data[o : o + spec.seq_len] for o in offsets.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        steps += 1
    return steps, steps * spec.batch_size * spec.seq_len

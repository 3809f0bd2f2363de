"""A spread over prompts for acceptance figures: per-prompt [accepted, rounds] pairs (as
`trainer.evaluate.evaluate` returns them under ``per_prompt``), pooled and resampled."""

from __future__ import annotations

import random


def accept_len(pairs: list[list[int]]) -> float:
    """Mean acceptance length of the pooled prompts: tokens yielded per verifying forward."""
    accepted, rounds = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    return (accepted + rounds) / max(rounds, 1)


def ratio_spread(on: list[list[int]], off: list[list[int]], draws: int = 2000) -> tuple[float, float]:
    """The 5th and 95th percentiles of accept_len(on) / accept_len(off) over prompts resampled with
    replacement (the same prompts for both drafters: a paired bootstrap, seed 0)."""
    if len(on) != len(off) or not on:
        raise ValueError(f"a paired spread needs the same prompts on both sides ({len(on)} vs {len(off)})")
    rng, n, ratios = random.Random(0), len(on), []
    for _ in range(draws):
        idx = [rng.randrange(n) for _ in range(n)]
        ratios.append(accept_len([on[i] for i in idx]) / accept_len([off[i] for i in idx]))
    ratios.sort()
    return ratios[int(0.05 * draws)], ratios[int(0.95 * draws)]

"""Per-layer statistics of the rows written, kept raw in each ``row`` record of the manifest.

``stats[layer] = [tokens, sum_l2, count, sum, sumsq, max_abs, nonfinite, first_tokens, first_l2]``
(``tokens`` and ``sum_l2`` over tokens whose vector is finite, ``count``/``sum``/``sumsq``/``max_abs``
over finite elements; ``first_tokens``/``first_l2``: position 0's share of ``tokens``/``sum_l2``, so
that the mean L2 norm over the positions after the first, which does not move with the rows'
length mix, can be finished: position 0's norm is ~160x the others' on SmolLM2), so that chunk
statistics can be finished after a resume without reading the files again. Layers are named
``final`` (the hidden state after the final norm) and by capture point (``"2"``, ``"16"``, ...).
The monitor's data facts (hsmon/contracts/data_facts.py) read the same sums.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hsmon.contracts.data_facts import LayerTotals


def layer_sums(x: torch.Tensor) -> list[float]:
    """[tokens, sum_l2, count, sum, sumsq, max_abs, nonfinite, first_tokens, first_l2] of [seq, H]."""
    x = x.float()
    finite = torch.isfinite(x)
    nonfinite = int(finite.numel() - int(finite.sum()))
    clean = torch.where(finite, x, torch.zeros((), dtype=x.dtype)) if nonfinite else x
    token_ok = finite.all(dim=-1) if nonfinite else None
    norms = clean.norm(dim=-1)
    first_ok = bool(norms.numel()) and (token_ok is None or bool(token_ok[0]))
    first_l2 = float(norms[0].double()) if first_ok else 0.0
    if token_ok is not None:
        norms = norms[token_ok]
    count = int(finite.sum()) if nonfinite else x.numel()
    as64 = clean.double()
    return [int(norms.numel()), float(norms.double().sum()), count, float(as64.sum()),
            float((as64 * as64).sum()), float(clean.abs().max()) if clean.numel() else 0.0, nonfinite,
            int(first_ok), first_l2]


def row_stats(hidden_state: torch.Tensor, aux_hidden_state: torch.Tensor,
              capture_points: Sequence[int]) -> dict[str, list[float]]:
    """The raw sums of each layer of one row: ``final`` and each capture point (``aux_hidden_state``
    holds the capture points' states side by side)."""
    hidden = hidden_state.shape[-1]
    stats = {"final": layer_sums(hidden_state)}
    for k, point in enumerate(capture_points):
        stats[str(point)] = layer_sums(aux_hidden_state[:, k * hidden:(k + 1) * hidden])
    return stats


def finish_stats(sums: Sequence[Sequence[float]]) -> dict[str, float | int]:
    """Combine row sums of one layer into mean L2 norm, std, max |x| and NaN/Inf count (the same
    arithmetic the monitor's data facts use)."""
    totals = LayerTotals()
    for row in sums:
        totals.add(row)
    figures = totals.figures()
    out = {"mean_l2": figures["mean_l2"], "std": figures["std"], "max_abs": figures["max_abs"],
           "nonfinite": figures["nonfinite_values"]}
    if figures.get("mean_l2_rest") is not None:
        out["mean_l2_rest"] = figures["mean_l2_rest"]
    return out

"""Test helpers for non-finite data: a copy of the embedded target with a corrupted embedding row.

This is a real fault, not a fake: the copy is the embedded target's checkpoint with one row of
``model.embed_tokens.weight`` set to NaN, the way a corrupted checkpoint would be. Every row of
a dataset that holds that token then carries NaN hidden states in every layer (from that token
on) when extracted with the copy, and a drafter whose frozen embedding comes from the copy gets
a NaN loss on any batch holding it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

BAD_TOKEN = 777


def nan_embedding_target(path: Path, token: int = BAD_TOKEN) -> Path:
    """Copy the embedded target to ``path`` with embedding row ``token`` set to NaN."""
    from safetensors.torch import load_file, save_file

    from extractor.embedded_target import ensure_embedded_target

    if (path / "config.json").is_file():
        return path
    shutil.copytree(ensure_embedded_target(), path)
    weights = load_file(path / "model.safetensors")
    key = next(k for k in weights if k.endswith("embed_tokens.weight"))
    weights[key][token] = float("nan")
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return path


def token_rows(path: Path, rows: int, bad_rows: set[int], length: int = 24,
               token: int = BAD_TOKEN) -> Path:
    """A pre-tokenized dataset of ``rows`` rows; those in ``bad_rows`` hold ``token`` mid-row."""
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(rows):
            ids = [3 + (i * 37 + j * 11) % 500 for j in range(length)]
            if i in bad_rows:
                ids[length // 2] = token
            fh.write(json.dumps({"input_ids": ids, "loss_mask": [0] * 4 + [1] * (length - 4)}) + "\n")
    return path


def scaled_embedding_target(path: Path, factor: float = 1.5) -> Path:
    """Copy the embedded target to ``path`` with its token embedding scaled by ``factor``: another
    checkpoint of the same architecture, whose captured hidden states are ~45 % larger."""
    from safetensors.torch import load_file, save_file

    from extractor.embedded_target import ensure_embedded_target

    if (path / "config.json").is_file():
        return path
    shutil.copytree(ensure_embedded_target(), path)
    weights = load_file(path / "model.safetensors")
    key = next(k for k in weights if k.endswith("embed_tokens.weight"))
    weights[key] = weights[key] * factor
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return path


def overflow_embedding_target(path: Path, token: int = BAD_TOKEN, peak: float = 1e5) -> Path:
    """Copy the embedded target to ``path`` with embedding row ``token`` scaled so that its largest
    value is ``peak`` (default 1e5, beyond float16's 65,504): finite in the float32 checkpoint, Inf
    once the model runs with ``--dtype float16``, so every row holding that token overflows there."""
    from safetensors.torch import load_file, save_file

    from extractor.embedded_target import ensure_embedded_target

    if (path / "config.json").is_file():
        return path
    shutil.copytree(ensure_embedded_target(), path)
    weights = load_file(path / "model.safetensors")
    key = next(k for k in weights if k.endswith("embed_tokens.weight"))
    row = weights[key][token]
    weights[key][token] = row / row.abs().max() * peak
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return path

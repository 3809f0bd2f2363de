"""Reading what the drafter needs from a target model directory, without loading the model.

The drafter needs the target's config, its token embedding (frozen input of the drafter) and its
lm_head (frozen, recomputes the target distribution from the stored last hidden state). Both come
straight out of the safetensors files, so a 60-layer target costs two tensors, not a model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch


class TargetError(ValueError):
    """Unusable target directory; the message names it and the fix."""


def resolve_target(path: str | None) -> Path:
    """The target directory given, a preset's (`extractor.targets`: embedded, smollm2), or the
    embedded default target (built on first use)."""
    try:
        from extractor.targets import ModelUnavailable, resolve_model
    except ImportError as exc:
        if path and (Path(path) / "config.json").is_file():
            return Path(path)
        raise TargetError(f"--target-model {path or '(none)'}: presets are not available in this build; "
                          "pass --target-model DIR") from exc
    try:
        return resolve_model(path, "--target-model")
    except ModelUnavailable as exc:
        raise TargetError(str(exc)) from None


def extracted_from(data_dir: Path) -> str | None:
    """The model an `hsmon extract` output says it came from (its manifest's first record), when
    that model is a directory here; None otherwise (another layout, or a server's remote path)."""
    from hsmon.contracts.layout import MANIFEST_NAME

    try:
        with open(data_dir / MANIFEST_NAME, "rb") as manifest:
            first = json.loads(manifest.readline() or b"{}")
    except (OSError, ValueError):
        return None
    settings = first.get("settings") if isinstance(first, dict) else None
    model = settings.get("model") if isinstance(settings, dict) else None
    if isinstance(model, str) and (Path(model) / "config.json").is_file():
        return model
    return None


def trained_for(drafter: Path) -> str | None:
    """The target a training output's newest checkpoint names (the --target-model it trained
    with), when that directory is here; None for an export or anything else."""
    if (drafter / "model.safetensors").is_file():
        return None
    from trainer.checkpoint import latest_checkpoint

    checkpoint = latest_checkpoint(drafter) if drafter.is_dir() else drafter if drafter.is_file() else None
    if checkpoint is None:
        return None
    try:
        state = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)
    except (OSError, RuntimeError, ValueError):
        return None
    model = state.get("target_model") if isinstance(state, dict) else None
    return model if isinstance(model, str) and (Path(model) / "config.json").is_file() else None


def load_target_config(target: Path) -> dict[str, Any]:
    config = json.loads((target / "config.json").read_text())
    if "text_config" in config and "hidden_size" not in config:
        config = {**config, **config["text_config"]}
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size"):
        if key not in config:
            raise TargetError(f"{target}/config.json lacks {key}; it is not a decoder-only LM config")
    return config


def _tensor_files(target: Path) -> dict[str, Path]:
    index = target / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: target / file for name, file in weight_map.items()}
    single = target / "model.safetensors"
    if single.is_file():
        from safetensors import safe_open

        with safe_open(str(single), framework="pt") as fh:
            return {name: single for name in fh.keys()}  # noqa: SIM118
    raise TargetError(f"{target}: no model.safetensors or model.safetensors.index.json; save the "
                      "target with save_pretrained(safe_serialization=True)")


def _load(files: dict[str, Path], names: list[str], target: Path) -> torch.Tensor:
    from safetensors import safe_open

    for name in names:
        if name in files:
            with safe_open(str(files[name]), framework="pt") as fh:
                return fh.get_tensor(name)
    raise TargetError(f"{target}: none of {names} among its tensors")


def load_embed_and_head(target: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(embedding [V, H], lm_head [V, H]) of the target, in float32."""
    config = load_target_config(target)
    files = _tensor_files(target)
    embed_names = ["model.embed_tokens.weight", "embed_tokens.weight",
                   "model.language_model.embed_tokens.weight"]
    embed = _load(files, embed_names, target)
    if config.get("tie_word_embeddings") and "lm_head.weight" not in files:
        head = embed
    else:
        head = _load(files, ["lm_head.weight", "model.lm_head.weight"], target)
    return embed.float(), head.float()

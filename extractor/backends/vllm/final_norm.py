"""The target's own final norm, for the last layer vLLM returns before it.

vLLM's extraction path returns the layers it captures, not the output of the final norm; vllm-serve
asks for the last layer's id too, and the client applies the model's final norm to it here: the norm
module of the model's own transformers class (built on the meta device, nothing else allocated) with
its weights read from the checkpoint, so a Gemma-style norm or an MoE family's is the one the model
runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch


def _checkpoint_tensors(model_dir: Path, names: set[str]) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in model_dir.glob("*.safetensors"))
    found: dict[str, torch.Tensor] = {}
    for name in files:
        with safe_open(str(model_dir / name), framework="pt") as fh:
            for key in set(fh.keys()) & names:
                found[key] = fh.get_tensor(key)
    return found


def load_final_norm(model_dir: str | Path) -> Any:
    """The model's final norm module on the CPU, with the checkpoint's weights; ValueError naming the
    model when its decoder has no ``norm`` or the checkpoint lacks its weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    model_dir = Path(model_dir)
    config = AutoConfig.from_pretrained(str(model_dir))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    norm = getattr(model.get_decoder(), "norm", None)
    if norm is None:
        raise ValueError(
            f"--model {model_dir}: its decoder has no final `norm` module; the vllm backend "
            "cannot finish the last layer for it"
        )
    prefix = next(name for name, module in model.named_modules() if module is norm)
    wanted = {f"{prefix}.{p}": p for p, _ in norm.named_parameters()}
    tensors = _checkpoint_tensors(model_dir, set(wanted))
    if set(tensors) != set(wanted):
        by_suffix = _checkpoint_tensors(model_dir, _norm_keys(model_dir))
        tensors = {f"{prefix}.{key.rsplit('.', 1)[-1]}": t for key, t in by_suffix.items()}
    if set(tensors) != set(wanted):
        raise ValueError(
            f"--model {model_dir}: its checkpoint has no {', '.join(sorted(wanted))}; the vllm "
            "backend needs the final norm's weights"
        )
    norm = norm.to_empty(device="cpu")
    norm.load_state_dict({wanted[k]: t for k, t in tensors.items()})
    return norm.eval()


def _norm_keys(model_dir: Path) -> set[str]:
    """Checkpoint keys of a final norm saved under another prefix (``...model.norm.weight``)."""
    from safetensors import safe_open

    keys: set[str] = set()
    for path in model_dir.glob("*.safetensors"):
        with safe_open(str(path), framework="pt") as fh:
            keys |= {k for k in fh.keys() if k.endswith("model.norm.weight") and ".layers." not in k}  # noqa: SIM118
    return keys

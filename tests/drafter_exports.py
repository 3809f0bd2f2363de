"""Drafter exports for either engine, for the tests of serving one engine's export on the other: the shipped
reference drafter's weights (hsmon/demo/reference-drafter, trained on the embedded target at capture
points 2,4,5) under a config.json that export-drafter's own function writes for the engine."""

from __future__ import annotations

import json
from pathlib import Path

from trainer.export import sglang_config

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "hsmon" / "demo" / "reference-drafter"  # an EAGLE-3 export for the embedded target
TARGET = ROOT / "extractor" / "embedded"
DRAFTER = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 2048,
    "draft_vocab_size": 1024,
    "num_aux": 3,
    "rms_norm_eps": 1e-5,
    "rope_theta": 1e4,
    "max_position_embeddings": 2048,
    "hidden_act": "silu",
    "target_num_layers": 8,
    "target_extra": {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0},
}


def export_for(engine: str, out: Path, aux_ids: tuple[int, ...] = (1, 3, 4)) -> Path:
    """The reference drafter's weights under a config.json written by export-drafter's own function for
    ``engine`` (training's aux ids 1,3,4 are capture points 2,4,5)."""
    out.mkdir(parents=True)
    (out / "model.safetensors").symlink_to(REFERENCE / "model.safetensors")
    config = sglang_config(DRAFTER, list(aux_ids), engine=engine)
    config["hsmon_estimate"] = json.loads((REFERENCE / "config.json").read_text())[
        "hsmon_estimate"
    ]  # its training's
    (out / "config.json").write_text(json.dumps(config))
    return out

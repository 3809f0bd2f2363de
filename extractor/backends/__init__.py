"""Backends that turn token ids into hidden states: `hf` (transformers in-process), `sglang` (SGLang
servers over HTTP) and `vllm` (vLLM servers over HTTP)."""

from __future__ import annotations

from typing import Any


def create_backend(name: str, model_dir: str, context: Any = None, **options: Any):
    """Load backend ``name`` for the model in ``model_dir``; ``context`` (a RunContext) is for
    backends that report pauses and honour stops themselves."""
    if name == "hf":
        from extractor.backends.hf import HFBackend

        options.pop("info", None)
        return HFBackend(model_dir, **options)
    if name == "sglang":
        from extractor.backends.sglang.backend import SGLangBackend

        return SGLangBackend(model_dir, options["capture_points"], options["info"], options["options"],
                             context)
    if name == "vllm":
        from extractor.backends.vllm.backend import VLLMBackend

        return VLLMBackend(model_dir, options["capture_points"], options["info"], options["options"], context)
    raise ValueError(f"--backend {name!r}: unknown backend (available: hf, sglang, vllm)")

"""Backends that turn token ids into hidden states: `hf` (transformers in-process) today."""

from __future__ import annotations

from typing import Any


def create_backend(name: str, model_dir: str, **options: Any):
    """Load backend ``name`` for the model in ``model_dir``."""
    if name == "hf":
        from extractor.backends.hf import HFBackend

        return HFBackend(model_dir, **options)
    raise ValueError(f"--backend {name!r}: unknown backend (available: hf)")

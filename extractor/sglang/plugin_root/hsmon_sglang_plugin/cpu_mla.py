"""DeepSeek-style MLA on SGLang's CPU engine: a ``torch_native`` entry in SGLang's own registry of
attention handlers (``AttentionBackendRegistry``, models/deepseek_common/attention_backend_handler.py).

SGLang's DeepSeek code asks that registry which attention method a batch takes, per backend; it
has no entry for ``torch_native`` (the CPU engine's backend) and falls back to ``triton``'s, which
sends a prefill without a cached prefix down the MHA path. On a CPU without AMX that path reads
the latent KV cache as if it held full heads, and the server dies at its first prefill
("Expected size for first two dimensions of batch2 tensor ..."). The entry registered here answers
the absorbed MLA method (``_dispatch_mla_subtype``: MLA, or the fused-rope CPU kernel where AMX
is there), which torch_native computes from the latent cache. Registered on the CPU engine only
(``SGLANG_USE_CPU_ENGINE=1``, set by ``hsmon sglang-serve`` on CPU), never over an existing entry,
and without touching SGLang's files.
"""

from __future__ import annotations

import os
from typing import Any

BACKEND = "torch_native"
HANDLERS = "sglang.srt.models.deepseek_common.attention_backend_handler"


def on_cpu_engine(env: dict[str, str] | None = None) -> bool:
    return (os.environ if env is None else env).get("SGLANG_USE_CPU_ENGINE", "") not in ("", "0")


def register_torch_native() -> bool:
    """Register the absorbed-MLA handler for torch_native on the CPU engine; True when added."""
    if not on_cpu_engine():
        return False
    import importlib

    try:
        handlers = importlib.import_module(HANDLERS)
    except ImportError:  # a release without the registry: nothing to register into
        return False
    registry = handlers.AttentionBackendRegistry
    if BACKEND in registry._handlers:
        return False
    dispatch = handlers._dispatch_mla_subtype

    def handle_attention_torch_native(attn: Any, forward_batch: Any) -> Any:
        return dispatch(attn, forward_batch)

    registry.register(BACKEND, handle_attention_torch_native)
    return True

"""hsmon's stand-in for sgl-kernel, whose CPU build is not published on PyPI.

With SGLANG_USE_CPU_ENGINE=1, SGLang imports a few ``*_cpu`` kernels from sgl_kernel when its
modules load; on a CPU without the AMX kernels (``torch.ops.sgl_kernel.convert_weight_packed``,
never defined here) it uses plain torch for the model's layers. What this package implements, in
plain torch and only as a test device (a GPU server runs SGLang's real kernels), is what EAGLE
speculative decoding at ``--speculative-eagle-topk 1`` calls on CPU with the intel_amx attention
backend: the draft tree (spec_tree.py), the KV-slot bookkeeping (cache_locs.py), the KV pool's
slot copy (kv_copy.py) and the two attention ops (attention.py, registered on
``torch.ops.sgl_kernel``). Every other name resolves to a function that raises when called, so an
unexpected call fails loudly.
"""

from sgl_kernel import attention as _attention  # noqa: F401  (registers the torch ops)
from sgl_kernel.cache_locs import (
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    assign_req_to_token_pool_cpu,
    build_draft_decode_metadata_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
)
from sgl_kernel.kv_copy import copy_all_layer_kv_cache_cpu
from sgl_kernel.spec_tree import build_tree_kernel_efficient_cpu, verify_tree_greedy_cpu

__version__ = "0.0.0+hsmon-stub"

__all__ = [
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "verify_tree_greedy_cpu",
]


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def unavailable(*args: object, **kwargs: object) -> None:
        raise NotImplementedError(f"sgl_kernel.{name} is not available in hsmon's CPU stand-in")

    unavailable.__name__ = name
    return unavailable

"""Moving KV-cache slots, every layer at once: sgl-kernel's ``copy_all_layer_kv_cache_cpu``.

SGLang's KV pool hands the kernel raw buffer addresses (``data_ptrs``, one per key or value
buffer) and each buffer's slot size in bytes (``strides``), and calls it once at start-up as a
warm-up. This stand-in copies the bytes with ctypes: all source slots are read before any target
is written, so overlapping moves behave like the kernel's load-then-store.
"""

from __future__ import annotations

import ctypes

import torch


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """For every buffer, slot ``src_loc[i]`` is copied onto slot ``tgt_loc[i]``."""
    targets, sources = tgt_loc.tolist(), src_loc.tolist()
    if len(targets) != len(sources):
        raise ValueError("copy_all_layer_kv_cache_cpu: tgt_loc and src_loc differ in length")
    for base, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        rows = [ctypes.string_at(base + s * stride, stride) for s in sources]
        for t, row in zip(targets, rows, strict=True):
            ctypes.memmove(base + t * stride, row, stride)

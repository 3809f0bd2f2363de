"""The intel_amx attention backend's two ops over SGLang's paged KV cache, in plain torch.

``torch.ops.sgl_kernel.decode_attention_cpu`` (one query token per request; it also writes the
new token's key and value into the cache) and ``torch.ops.sgl_kernel.extend_attention_cpu`` (a
run of new tokens per request after a cached prefix, causal, or under a per-request tree mask
for speculative verification), with the argument lists SGLang 0.5.23's
``IntelAMXAttnBackend`` passes. Registered as torch ops because the backend looks them up on
``torch.ops.sgl_kernel``. What the tests never need (cross attention, encoder lengths, attention
sinks, sliding windows, fp8 caches) raises.
"""

from __future__ import annotations

import torch

_LIB = torch.library.Library("sgl_kernel", "FRAGMENT")

_DECODE_SCHEMA = (
    "decode_attention_cpu(Tensor query, Tensor(a!) k_cache, Tensor(b!) v_cache, float k_scale, "
    "float v_scale, Tensor(c!) output, Tensor? key, Tensor? value, Tensor loc, Tensor(d!) attn_logits, "
    "Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, float sm_scale, float logit_cap, "
    "bool is_cross_attn, int sliding_window_size, Tensor? encoder_lens, Tensor? sinks) -> ()"
)
_EXTEND_SCHEMA = (
    "extend_attention_cpu(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, Tensor(a!) o_extend, "
    "Tensor k_buffer, Tensor v_buffer, float k_scale, float v_scale, Tensor req_to_token, "
    "Tensor req_pool_indices, Tensor seq_lens, Tensor extend_seq_lens, Tensor extend_start_loc, "
    "int? max_len_extend, float sm_scale, float logit_cap, bool is_cross_attn, int sliding_window_size, "
    "Tensor? encoder_lens, Tensor? sinks, Tensor? tree_mask, bool is_causal) -> ()"
)


def _unsupported(op: str, is_cross_attn: bool, sliding_window_size: int, encoder_lens, sinks, cache) -> None:
    for what, used in (
        ("cross attention", is_cross_attn),
        ("a sliding window", sliding_window_size > 0),
        ("encoder lengths", encoder_lens is not None),
        ("attention sinks", sinks is not None),
        ("an fp8 KV cache", cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)),
    ):
        if used:
            raise NotImplementedError(f"sgl_kernel.{op}: {what} is not implemented in hsmon's CPU stand-in")


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    logit_cap: float,
    visible: torch.Tensor | None,
) -> torch.Tensor:
    """q [t, H, D] over k [s, Hk, D] / v [s, Hk, Dv] (grouped heads), in float32; ``visible``
    [t, s] (True = attend) or None for all. Returns [t, H, Dv] in float32."""
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,shd->hts", q.float(), k) * scale
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    if visible is not None:
        scores = scores.masked_fill(~visible.unsqueeze(0), float("-inf"))
    return torch.einsum("hts,shd->thd", torch.softmax(scores, dim=-1), v)


def decode_attention_cpu(
    query,
    k_cache,
    v_cache,
    k_scale,
    v_scale,
    output,
    key,
    value,
    loc,
    attn_logits,
    req_to_token,
    req_pool_indices,
    seq_lens,
    sm_scale,
    logit_cap,
    is_cross_attn,
    sliding_window_size,
    encoder_lens,
    sinks,
) -> None:
    """Write ``key``/``value`` at ``loc``, then each request's query attends over its first
    ``seq_lens[b]`` cached tokens (``req_to_token[req_pool_indices[b]]``). ``attn_logits`` (the
    kernel's split scratch space) is left alone."""
    _unsupported("decode_attention_cpu", is_cross_attn, sliding_window_size, encoder_lens, sinks, k_cache)
    if key is not None and value is not None:
        k_cache[loc] = key.to(k_cache.dtype)
        v_cache[loc] = value.to(v_cache.dtype)
    for b, (req, seq_len) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=True)):
        slots = req_to_token[req, :seq_len].to(torch.int64)
        out = attend(query[b : b + 1], k_cache[slots], v_cache[slots], sm_scale, logit_cap, None)
        output[b] = out[0].to(output.dtype)


def _extend_visibility(prefix: int, length: int, is_causal: bool, tree: torch.Tensor | None) -> torch.Tensor:
    """[length, prefix + length]: every new token sees the whole prefix; among the new tokens, the
    tree mask's rows, else causal order, else all."""
    visible = torch.ones((length, prefix + length), dtype=torch.bool)
    if tree is not None:
        visible[:, prefix:] = tree
    elif is_causal:
        visible[:, prefix:] = torch.ones((length, length), dtype=torch.bool).tril()
    return visible


def extend_attention_cpu(
    q_extend,
    k_extend,
    v_extend,
    o_extend,
    k_buffer,
    v_buffer,
    k_scale,
    v_scale,
    req_to_token,
    req_pool_indices,
    seq_lens,
    extend_seq_lens,
    extend_start_loc,
    max_len_extend,
    sm_scale,
    logit_cap,
    is_cross_attn,
    sliding_window_size,
    encoder_lens,
    sinks,
    tree_mask,
    is_causal,
) -> None:
    """Each request's ``extend_seq_lens[b]`` new tokens (rows ``extend_start_loc[b]...`` of
    ``q_extend``/``k_extend``/``v_extend``) attend over its cached prefix (the first
    ``seq_lens[b] - extend_seq_lens[b]`` slots of its table) and over the new tokens. The tree
    mask, when given, holds one ``n x n`` block per request (QLEN_ONLY layout)."""
    _unsupported("extend_attention_cpu", is_cross_attn, sliding_window_size, encoder_lens, sinks, k_buffer)
    offset = 0
    rows = zip(req_pool_indices.tolist(), seq_lens.tolist(), extend_seq_lens.tolist(),
               extend_start_loc.tolist(), strict=True)
    for req, seq_len, length, start in rows:
        prefix = seq_len - length
        slots = req_to_token[req, :seq_len].to(torch.int64)
        keys, values = k_buffer[slots], v_buffer[slots]
        if (
            k_extend is not None and v_extend is not None
        ):  # the new tokens as given (the cache holds them too)
            keys = torch.cat([keys[:prefix], k_extend[start : start + length].to(keys.dtype)])
            values = torch.cat([values[:prefix], v_extend[start : start + length].to(values.dtype)])
        tree = None
        if tree_mask is not None:
            tree = tree_mask.view(-1)[offset : offset + length * length].view(length, length).bool()
            offset += length * length
        out = attend(
            q_extend[start : start + length],
            keys,
            values,
            sm_scale,
            logit_cap,
            _extend_visibility(prefix, length, is_causal, tree),
        )
        o_extend[start : start + length] = out.to(o_extend.dtype)


_LIB.define(_DECODE_SCHEMA)
_LIB.impl("decode_attention_cpu", decode_attention_cpu, "CPU")
_LIB.define(_EXTEND_SCHEMA)
_LIB.impl("extend_attention_cpu", extend_attention_cpu, "CPU")

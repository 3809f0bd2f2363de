"""KV-cache slot bookkeeping of EAGLE's worker on CPU.

Torch stand-ins for sgl-kernel's cache-location kernels, written from their semantics.
``req_to_token`` is the request-to-slot table (int32, one row of ``pool_len`` slots per request);
the outputs are filled in place except for ``build_draft_decode_metadata_cpu``, which returns a
new table.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


def _row_slice(req_to_token: torch.Tensor, req: int, start: int, length: int, pool_len: int) -> torch.Tensor:
    return req_to_token.view(-1)[req * pool_len + start : req * pool_len + start + length]


def _spans(
    req_pool_indices: torch.Tensor, req_to_token: torch.Tensor, start_offset: torch.Tensor,
    end_offset: torch.Tensor, pool_len: int,
) -> Iterator[tuple[torch.Tensor, slice]]:
    """Per request in order: its table's positions ``[start, end)`` and where they sit in the
    concatenated ``out_cache_loc``."""
    at = 0
    for req, start, end in zip(
        req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist(), strict=True
    ):
        yield _row_slice(req_to_token, req, start, end - start, pool_len), slice(at, at + end - start)
        at += end - start


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_steps: int,
) -> None:
    """``out_cache_loc`` (bs * topk * num_steps): for each request the ``topk * num_steps`` slots
    its table holds from position ``seq_len`` on (where the draft steps write)."""
    width = topk * num_steps
    if out_cache_loc.numel() != req_pool_indices.numel() * width:
        raise ValueError("assign_draft_cache_locs_contiguous_cpu: out_cache_loc has the wrong size")
    for b, (req, seq_len) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=True)):
        out_cache_loc[b * width : (b + 1) * width] = _row_slice(req_to_token, req, seq_len, width, pool_len)


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """The inverse of ``assign_extend_cache_locs_cpu``: positions ``[start, end)`` of each request's
    table get the next ``end - start`` slots of ``out_cache_loc`` (consumed in request order)."""
    for row, packed in _spans(req_pool_indices, req_to_token, start_offset, end_offset, pool_len):
        row[:] = out_cache_loc[packed]


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """``out_cache_loc``: the slots of positions ``[start, end)`` of each request, concatenated."""
    for row, packed in _spans(req_pool_indices, req_to_token, start_offset, end_offset, pool_len):
        out_cache_loc[packed] = row


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor, out_cache_loc: torch.Tensor, accept_out_cache_loc: torch.Tensor, size: int
) -> None:
    """The slots of the accepted nodes (``accept_index``'s first ``size`` entries, -1 = none), in
    order, packed at the front of ``accept_out_cache_loc``."""
    index = accept_index.view(-1)[:size].to(torch.int64)
    kept = out_cache_loc.view(-1)[index[index > -1]]
    accept_out_cache_loc.view(-1)[: kept.numel()] = kept


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor, accept_lens: torch.Tensor, bonus_tokens: torch.Tensor, accept_stride: int
) -> None:
    """Each request's last accepted token: ``accept_tokens[stride * b + accept_lens[b] - 1]``."""
    rows = torch.arange(accept_lens.numel(), dtype=torch.int64) * accept_stride
    bonus_tokens.view(-1)[:] = accept_tokens.view(-1)[rows + accept_lens.to(torch.int64) - 1]


def build_draft_decode_metadata_cpu(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    pool_len: int,
) -> torch.Tensor:
    """A request-to-slot table for the draft's decode steps, one row per (request, candidate):
    the request's prefix, then that candidate's ``num_steps`` draft slots (which the request's
    row holds at ``seq_len + candidate * num_steps``). Past those the row is zero."""
    num_seqs = req_pool_indices.numel()
    table = torch.zeros((num_seqs * topk, pool_len), dtype=req_to_token.dtype)
    for b, (req, seq_len) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=True)):
        source = req_to_token.view(-1, pool_len)[req]
        for k in range(topk):
            row = table[b * topk + k]
            row[:seq_len] = source[:seq_len]
            row[seq_len : seq_len + num_steps] = source[
                seq_len + k * num_steps : seq_len + (k + 1) * num_steps
            ]
    return table

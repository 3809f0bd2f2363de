"""EAGLE's draft tree on CPU: building it from the draft step's choices and verifying it greedily.

Torch stand-ins for sgl-kernel's ``build_tree_kernel_efficient_cpu`` and
``verify_tree_greedy_cpu``, written from the kernels' semantics (each fills the tensors it is
given, in place). Nodes are numbered 0..n-1 per request: node 0 is the last verified token, node
``i >= 1`` the draft token ``selected_index[i - 1]``; a node's parent is found through
``parent_list``. The tree is linked as first-child / next-sibling lists, children inserted at the
head in descending node order (so a parent's first child is its lowest-numbered one).
"""

from __future__ import annotations

import torch

QLEN_ONLY = 1
BITPACKING = 2


def _parent_positions(parents: list[int], selected: list[int], topk: int, n: int) -> list[int]:
    """Each node's parent node (0 for the root's children); -1 where no parent is found."""
    out = [0] * n
    for i in range(1, n):
        branch = selected[i - 1] // topk
        if branch == 0:
            continue
        token = parents[branch]
        out[i] = selected.index(token) + 1 if token in selected else -1
    return out


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """Fill positions, the retrieve lists and the tree mask (FULL_MASK: one row of prefix + tree
    per node; QLEN_ONLY: n x n per request); the retrieve lists arrive filled with -1."""
    if tree_mask_mode == BITPACKING:
        raise NotImplementedError("build_tree_kernel_efficient_cpu: QLEN_ONLY_BITPACKING has no CPU path")
    n = draft_token_num
    seq_lens = [int(x) for x in verified_seq_len.tolist()]
    mask = tree_mask.view(-1)
    flat_pos = positions.view(-1)
    prefix_rows = 0  # FULL_MASK: the prefix columns of the requests before this one
    for b, seq_len in enumerate(seq_lens):
        parent = _parent_positions(parent_list[b].tolist(), selected_index[b].tolist(), topk, n)
        retrive_index[b] = torch.arange(b * n, (b + 1) * n, dtype=retrive_index.dtype)
        for i in range(n - 1, 0, -1):
            p = parent[i]
            if p < 0:
                continue
            first = int(retrive_next_token[b, p])
            if first != -1:
                retrive_next_sibling[b, i] = first
            retrive_next_token[b, p] = i
        if tree_mask_mode == QLEN_ONLY:
            width, row0 = n, b * n * n
        else:
            width, row0 = seq_len + n, b * n * n + prefix_rows * n
        for tid in range(n):
            start = row0 + tid * width + (width - n)  # the node's row, past its prefix columns
            mask[start : start + n] = False
            mask[start] = True  # every node sees the root
            node, depth_of = tid, 0
            while node > 0:  # the node and its ancestors up to (not counting) the root
                mask[start + node] = True
                depth_of += 1
                node = parent[node] if parent[node] >= 0 else 0
            flat_pos[b * n + tid] = seq_len + depth_of
        prefix_rows += seq_len


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Walk each request's tree from the root, at each level accepting the first child whose draft
    token equals the target's prediction at the last accepted node; fill ``accept_index`` (the
    accepted nodes' flat ids, root first), ``accept_token_num`` (accepted drafts, root not counted)
    and ``predicts`` (the target's token at every accepted node, the bonus token included)."""
    steps = accept_index.shape[1]
    target = target_predict.view(-1).tolist()
    for b in range(candidates.shape[0]):
        ids = retrive_index[b].tolist()
        nxt, sib, cand = (
            retrive_next_token[b].tolist(),
            retrive_next_sibling[b].tolist(),
            candidates[b].tolist(),
        )
        last = ids[0]
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        for _ in range(1, steps):
            cur = nxt[cur]
            while cur != -1 and cand[cur] != target[last]:
                cur = sib[cur]
            if cur == -1:
                break
            predicts.view(-1)[last] = target[last]
            accepted += 1
            accept_index[b, accepted] = ids[cur]
            last = ids[cur]
        accept_token_num[b] = accepted
        predicts.view(-1)[last] = target[last]

"""hsmon's CPU stand-in for sgl-kernel (tests/sglang_stubs/sgl_kernel): each kernel SGLang's EAGLE
worker calls at top-k 1 against a direct reference written from the kernel's semantics (plain
loops over Python ints; SDPA per request for attention). The stand-in runs in SGLang's server;
these tests need only torch, so they run in the main environment."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent / "sglang_stubs"))
import sgl_kernel

QLEN_ONLY, FULL_MASK = 1, 0


def chain_inputs(bs: int, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """parent_list and selected_index as SGLang's worker builds them at top-k 1 (a chain)."""
    parents = torch.arange(-1, steps - 1, dtype=torch.int64).repeat(bs, 1)
    return parents, torch.arange(steps, dtype=torch.int64).repeat(bs, 1)


def random_tree(bs: int, topk: int, steps: int, n: int, gen: torch.Generator):
    """A valid draft tree (top-k per step, the best n - 1 nodes kept), as SGLang's draft loop picks."""
    scores = torch.rand(bs, topk, generator=gen)
    chunks, parents = [scores], [torch.arange(-1, topk, dtype=torch.int64).expand(bs, -1)]
    for i in range(1, steps):
        expand = scores.unsqueeze(2) * torch.rand(bs, topk, topk, generator=gen)
        scores, index = torch.topk(expand.flatten(1), topk, dim=-1)
        chunks.append(expand.flatten(1))
        parents.append(index + topk * topk * (i - 1) + topk)
    selected = torch.sort(torch.topk(torch.cat(chunks, 1), n - 1, dim=-1).indices, dim=-1).values
    return torch.cat(parents[:-1], 1).contiguous(), selected.contiguous()


def ref_tree(parents, selected, seq_lens, topk, n):
    """Per request: each node's parent, its depth, its first child and next sibling, its ancestors."""
    out = []
    for b in range(selected.shape[0]):
        sel, par = selected[b].tolist(), parents[b].tolist()
        parent = [0] * n
        for i in range(1, n):
            branch = sel[i - 1] // topk
            parent[i] = 0 if branch == 0 else sel.index(par[branch]) + 1
        children = {p: sorted(i for i in range(1, n) if parent[i] == p) for p in range(n)}
        first = [children[p][0] if children[p] else -1 for p in range(n)]
        sibling = [-1] * n
        for kids in children.values():
            for a, c in itertools.pairwise(kids):
                sibling[a] = c
        ancestors = []
        for i in range(n):
            chain, j = [], i
            while j:
                chain.append(j)
                j = parent[j]
            ancestors.append(chain)
        out.append((first, sibling, ancestors, int(seq_lens[b])))
    return out


def run_build(parents, selected, seq_lens, topk, steps, n, mode):
    bs = seq_lens.numel()
    size = bs * n * n + (int(seq_lens.sum()) * n if mode == FULL_MASK else 0)
    mask = torch.full((size,), True)
    positions = torch.empty(bs * n, dtype=torch.int64)
    index, nxt, sib = torch.full((3, bs, n), -1, dtype=torch.int64)
    sgl_kernel.build_tree_kernel_efficient_cpu(
        parents, selected, seq_lens, mask, positions, index, nxt, sib, topk, steps, n, mode
    )
    return mask, positions, index, nxt, sib


@pytest.mark.parametrize("topk,steps,n,bs", [(1, 3, 4, 1), (1, 5, 6, 3), (4, 3, 8, 3), (2, 4, 6, 2)])
@pytest.mark.parametrize("mode", [QLEN_ONLY, FULL_MASK])
def test_build_tree(topk: int, steps: int, n: int, bs: int, mode: int) -> None:
    gen = torch.Generator().manual_seed(7)
    parents, selected = chain_inputs(bs, steps) if topk == 1 else random_tree(bs, topk, steps, n, gen)
    seq_lens = torch.randint(3, 20, (bs,), generator=gen, dtype=torch.int64)
    mask, positions, index, nxt, sib = run_build(parents, selected, seq_lens, topk, steps, n, mode)
    at = 0
    for b, (first, sibling, ancestors, seq_len) in enumerate(ref_tree(parents, selected, seq_lens, topk, n)):
        assert index[b].tolist() == list(range(b * n, (b + 1) * n))
        assert nxt[b].tolist() == first
        assert sib[b].tolist() == sibling
        assert positions[b * n : (b + 1) * n].tolist() == [seq_len + len(a) for a in ancestors]
        width = n + (seq_len if mode == FULL_MASK else 0)
        rows = mask[at : at + n * width].view(n, width)
        at += n * width
        assert rows[:, : width - n].all()  # the prefix columns (FULL_MASK) stay visible
        for i in range(n):
            assert rows[i, width - n :].nonzero().flatten().tolist() == sorted([0, *ancestors[i]])
    if topk == 1:  # a chain: node i's only child is i + 1, each node sees itself and all before it
        assert nxt[0].tolist() == [*range(1, n), -1] and (sib == -1).all()


def ref_verify(candidates, index, nxt, sib, target, steps):
    bs, n = candidates.shape
    predicts, accept = [-1] * (bs * n), [[-1] * steps for _ in range(bs)]
    counts = []
    flat = target.flatten().tolist()
    for b in range(bs):
        last, count, node = int(index[b, 0]), 0, 0
        accept[b][0] = last
        for _ in range(1, steps):
            child = int(nxt[b, node])
            match = None
            while child != -1:
                if int(candidates[b, child]) == flat[last]:
                    match = child
                    break
                child = int(sib[b, child])
            if match is None:
                break
            predicts[last] = flat[last]
            count += 1
            node, last = match, int(index[b, match])
            accept[b][count] = last
        predicts[last] = flat[last]
        counts.append(count)
    return predicts, accept, counts


@pytest.mark.parametrize("topk,steps,n,vocab", [(1, 3, 4, 5), (1, 6, 7, 3), (4, 3, 8, 3)])
def test_verify_tree_greedy(topk: int, steps: int, n: int, vocab: int) -> None:
    gen = torch.Generator().manual_seed(11)
    bs = 4
    parents, selected = chain_inputs(bs, steps) if topk == 1 else random_tree(bs, topk, steps, n, gen)
    _, _, index, nxt, sib = run_build(parents, selected, torch.full((bs,), 9), topk, steps, n, QLEN_ONLY)
    candidates = torch.randint(0, vocab, (bs, n), generator=gen, dtype=torch.int64)
    target = torch.randint(0, vocab, (bs, n), generator=gen, dtype=torch.int64)
    if topk == 1:  # row b: its first b drafts equal the target's predictions, then one that does not
        for b in range(bs):
            for i in range(1, n):
                candidates[b, i] = target[b, i - 1] if i <= b else (target[b, i - 1] + 1) % vocab
    predicts = torch.full((bs * n,), -1, dtype=torch.int32)
    accept = torch.full((bs, steps + 1), -1, dtype=torch.int32)
    counts = torch.empty(bs, dtype=torch.int32)
    sgl_kernel.verify_tree_greedy_cpu(
        predicts=predicts,
        accept_index=accept,
        accept_token_num=counts,
        candidates=candidates,
        retrive_index=index,
        retrive_next_token=nxt,
        retrive_next_sibling=sib,
        target_predict=target,
    )
    want = ref_verify(candidates, index, nxt, sib, target, steps + 1)
    assert (predicts.tolist(), accept.tolist(), counts.tolist()) == want
    if topk == 1:
        assert counts.tolist() == [min(b, steps) for b in range(bs)]


def test_cache_slot_kernels() -> None:
    gen = torch.Generator().manual_seed(3)
    pool_len, reqs = 32, [2, 0, 5]
    table = torch.randperm(8 * pool_len, generator=gen).to(torch.int32).view(8, pool_len)
    rpi, seq_lens = torch.tensor(reqs), torch.tensor([4, 9, 1])
    topk, steps = 2, 3
    out = torch.empty(len(reqs) * topk * steps, dtype=torch.int64)
    sgl_kernel.assign_draft_cache_locs_contiguous_cpu(rpi, table, seq_lens, out, pool_len, topk, steps)
    want = [
        int(table[r, s + j])
        for r, s in zip(reqs, seq_lens.tolist(), strict=True)
        for j in range(topk * steps)
    ]
    assert out.tolist() == want

    start, end = torch.tensor([1, 0, 3]), torch.tensor([4, 2, 7])
    out = torch.empty(int((end - start).sum()), dtype=torch.int64)
    sgl_kernel.assign_extend_cache_locs_cpu(rpi, table, start, end, out, pool_len)
    want = [int(table[r, j]) for r, a, z in zip(reqs, [1, 0, 3], [4, 2, 7], strict=True) for j in range(a, z)]
    assert out.tolist() == want

    fresh = table.clone()
    slots = torch.arange(1000, 1000 + len(want), dtype=torch.int64)
    sgl_kernel.assign_req_to_token_pool_cpu(rpi, fresh, start, end, slots, pool_len)
    it = iter(slots.tolist())
    for r, a, z in zip(reqs, [1, 0, 3], [4, 2, 7], strict=True):
        for j in range(pool_len):
            assert int(fresh[r, j]) == (next(it) if a <= j < z else int(table[r, j]))

    draft = sgl_kernel.build_draft_decode_metadata_cpu(table, rpi, seq_lens, topk, steps, pool_len)
    for b, (r, s) in enumerate(zip(reqs, seq_lens.tolist(), strict=True)):
        for k in range(topk):
            row = draft[b * topk + k].tolist()
            assert row[:s] == table[r, :s].tolist()
            assert row[s : s + steps] == table[r, s + k * steps : s + (k + 1) * steps].tolist()


def test_accept_and_bonus_kernels() -> None:
    accept_index = torch.tensor([0, 1, -1, -1, 4, -1, -1, -1, 8, 9, 10, 11], dtype=torch.int32)
    out_cache_loc = torch.arange(100, 112, dtype=torch.int64)
    packed = torch.full((12,), -7, dtype=torch.int64)
    sgl_kernel.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, packed, 12)
    kept = [100 + i for i in accept_index.tolist() if i > -1]
    assert packed.tolist() == kept + [-7] * (12 - len(kept))

    tokens = torch.arange(12, dtype=torch.int32) * 10
    lens = torch.tensor([2, 1, 4], dtype=torch.int32)
    bonus = torch.empty(3, dtype=torch.int32)
    sgl_kernel.fill_bonus_tokens_cpu(tokens, lens, bonus, 4)
    assert bonus.tolist() == [int(tokens[4 * b + n - 1]) for b, n in enumerate(lens.tolist())]


def test_kv_slot_copy_moves_every_buffer() -> None:
    buffers = [torch.randn(10, 2, 3), torch.randn(10, 2, 5)]
    before = [b.clone() for b in buffers]
    ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64)
    strides = torch.tensor([b[0].numel() * b.element_size() for b in buffers], dtype=torch.int64)
    tgt, src = torch.tensor([1, 2, 7]), torch.tensor([2, 1, 0])  # 1 <-> 2 swap: read before write
    sgl_kernel.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    for buf, old in zip(buffers, before, strict=True):
        want = old.clone()
        want[[1, 2, 7]] = old[[2, 1, 0]]
        assert torch.equal(buf, want)


def sdpa(q, k, v, scale, mask):
    """One request's attention by torch's own SDPA: q [t, H, D], k/v [s, Hk, D], mask [t, s]."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale
    )
    return out.transpose(0, 1)


def paged_cache(gen, seq_lens, heads_kv, dim, pool_len=64, slots=256):
    k_cache, v_cache = (
        torch.randn(slots, heads_kv, dim, generator=gen),
        torch.randn(slots, heads_kv, dim, generator=gen),
    )
    table = (
        torch.randperm(slots, generator=gen)[: len(seq_lens) * pool_len].to(torch.int32).view(-1, pool_len)
    )
    return k_cache, v_cache, table


def test_decode_attention_writes_the_new_token_then_attends() -> None:
    gen = torch.Generator().manual_seed(5)
    heads, heads_kv, dim, seq_lens = 4, 2, 16, [5, 12]
    k_cache, v_cache, table = paged_cache(gen, seq_lens, heads_kv, dim)
    rpi = torch.tensor([1, 0])
    loc = torch.tensor([int(table[r, s - 1]) for r, s in zip([1, 0], seq_lens, strict=True)])
    q = torch.randn(2, heads, dim, generator=gen)
    key, value = torch.randn(2, heads_kv, dim, generator=gen), torch.randn(2, heads_kv, dim, generator=gen)
    out = torch.empty(2, heads, dim)
    logits = torch.zeros(2, heads, 8, dim + 1)
    torch.ops.sgl_kernel.decode_attention_cpu(
        q,
        k_cache,
        v_cache,
        1.0,
        1.0,
        out,
        key,
        value,
        loc,
        logits,
        table,
        rpi,
        torch.tensor(seq_lens),
        0.25,
        0.0,
        False,
        0,
        None,
        None,
    )
    assert torch.equal(k_cache[loc], key) and torch.equal(v_cache[loc], value)
    for b, (r, s) in enumerate(zip([1, 0], seq_lens, strict=True)):
        slots = table[r, :s].long()
        want = sdpa(q[b : b + 1], k_cache[slots], v_cache[slots], 0.25, None)
        torch.testing.assert_close(out[b : b + 1], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("tree", [False, True])
def test_extend_attention_over_a_cached_prefix(tree: bool) -> None:
    gen = torch.Generator().manual_seed(9)
    heads, heads_kv, dim = 4, 1, 8
    extend, seq_lens = [4, 4], [7, 13]
    k_cache, v_cache, table = paged_cache(gen, seq_lens, heads_kv, dim)
    rpi, total = torch.tensor([0, 1]), sum(extend)
    q = torch.randn(total, heads, dim, generator=gen)
    k, v = torch.randn(total, heads_kv, dim, generator=gen), torch.randn(total, heads_kv, dim, generator=gen)
    starts = [0, extend[0]]
    for b, (s, e) in enumerate(zip(seq_lens, extend, strict=True)):  # the backend writes them before the call
        slots = table[b, s - e : s].long()
        k_cache[slots], v_cache[slots] = k[starts[b] : starts[b] + e], v[starts[b] : starts[b] + e]
    blocks = [torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)] * 2
    mask = torch.cat([m.flatten() for m in blocks]) if tree else None
    out = torch.empty_like(q)
    torch.ops.sgl_kernel.extend_attention_cpu(
        q,
        k,
        v,
        out,
        k_cache,
        v_cache,
        1.0,
        1.0,
        table,
        rpi,
        torch.tensor(seq_lens),
        torch.tensor(extend),
        torch.tensor(starts),
        max(extend),
        0.3,
        0.0,
        False,
        0,
        None,
        None,
        mask,
        True,
    )
    for b, (s, e) in enumerate(zip(seq_lens, extend, strict=True)):
        slots = table[b, :s].long()
        visible = torch.ones(e, s, dtype=torch.bool)
        visible[:, s - e :] = blocks[b] if tree else torch.ones(e, e, dtype=torch.bool).tril()
        want = sdpa(q[starts[b] : starts[b] + e], k_cache[slots], v_cache[slots], 0.3, visible)
        torch.testing.assert_close(out[starts[b] : starts[b] + e], want, atol=1e-5, rtol=1e-5)


def test_unimplemented_names_still_raise() -> None:
    with pytest.raises(NotImplementedError, match="rmsnorm_cpu"):
        sgl_kernel.rmsnorm_cpu(torch.ones(1))
    with pytest.raises(NotImplementedError, match="sliding window"):
        torch.ops.sgl_kernel.decode_attention_cpu(
            torch.ones(1, 1, 2),
            torch.ones(4, 1, 2),
            torch.ones(4, 1, 2),
            1.0,
            1.0,
            torch.ones(1, 1, 2),
            None,
            None,
            torch.zeros(1, dtype=torch.int64),
            torch.ones(1),
            torch.zeros(1, 4, dtype=torch.int32),
            torch.zeros(1, dtype=torch.int64),
            torch.ones(1, dtype=torch.int64),
            1.0,
            0.0,
            False,
            8,
            None,
            None,
        )

"""Runs inside .sglang-venv: SGLang's own EAGLE-3 draft model drafts from an export.

usage: python forward_eagle3_export.py EXPORT_DIR INPUTS OUT [EXPORT_DIR INPUTS OUT ...]
INPUTS (safetensors): ``aux`` [T, K*H] target features, ``ids`` [T + D - 1] the token after each
position and then D - 1 draft tokens, ``embed`` the target's token embedding (SGLang shares it).
SGLang's ``LlamaForCausalLMEagle3`` loads EXPORT_DIR and runs what its EAGLE worker runs: one
draft extend over the T positions (fc, and ``fc_norm`` when config.json sets it), then D - 1
draft decode steps at the last position, each fed the hidden state the step before returned as
its aux output (post-norm with ``norm_output``). OUT gets ``logits_0`` [T, V] and ``logits_i``
[1, V] (i = 1..D-1): ``norm`` output times ``lm_head``.

Stand-in: attention goes through ``ContiguousKV`` below, plain causal attention over the keys of
this one sequence, instead of a paged KV-cache backend (which needs a model runner's memory
pools); every module of the drafter (fc_norm, fc, norms, fused qkv, rotary, MLP, lm_head) and
the hidden state it hands on are SGLang's.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import torch
from load_eagle3_export import sglang_draft_model


class ContiguousKV:
    """RadixAttention's backend for one sequence: keeps each layer's keys and values and lets a
    query attend to every earlier key (causal within an extend)."""

    def __init__(self) -> None:
        self.kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def forward(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        old_k, old_v = self.kv.get(layer.layer_id, (k[:0], v[:0]))
        keys, values = torch.cat([old_k, k]), torch.cat([old_v, v])
        self.kv[layer.layer_id] = (keys, values)
        q = q.view(-1, layer.tp_q_head_num, layer.qk_head_dim).transpose(0, 1)  # [h, n, d]
        groups = layer.tp_q_head_num // layer.tp_k_head_num
        keys = keys.repeat_interleave(groups, dim=1).transpose(0, 1)
        values = values.repeat_interleave(groups, dim=1).transpose(0, 1)
        scores = torch.matmul(q, keys.transpose(-1, -2)) * layer.scaling
        n, total = q.shape[1], keys.shape[1]
        query_pos = torch.arange(total - n, total)[:, None]
        scores = scores.masked_fill(torch.arange(total)[None, :] > query_pos, float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1), values)
        return out.transpose(0, 1).reshape(n, -1)


def main(export_dir: str, inputs: str, out: str, set_up: bool = True) -> int:
    import os

    from safetensors.torch import load_file, save_file
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.model_executor.forward_context import ForwardContext, set_forward_context

    _, model = sglang_draft_model(export_dir, set_up)
    model.load_weights(iter(load_file(os.path.join(export_dir, "model.safetensors")).items()))
    data = load_file(inputs)
    model.model.embed_tokens.weight.data[: data["embed"].shape[0]].copy_(data["embed"])  # padded rows
    aux, ids = data["aux"].float(), data["ids"]
    seq, depth = aux.shape[0], ids.shape[0] - aux.shape[0] + 1
    set_forward_context(ForwardContext(attn_backend=ContiguousKV()))
    lm_head = model.lm_head.weight[: model.config.draft_vocab_size]

    def run(mode, input_ids, positions, hidden):
        batch = SimpleNamespace(
            forward_mode=mode, spec_info=SimpleNamespace(hidden_states=hidden), mm_input_embeds=None,
            contains_mm_inputs=lambda: False, global_num_token_non_padded_cpu=None, mha_return_lse=False,
        )
        to_logits, (to_next,) = model.model(input_ids, positions, batch)
        return to_logits @ lm_head.T, to_next

    results = {}
    with torch.no_grad():
        logits, hidden = run(ForwardMode.EXTEND, ids[:seq], torch.arange(seq), aux)
        results["logits_0"] = logits
        hidden = hidden[-1:]
        for i in range(1, depth):
            logits, hidden = run(ForwardMode.DECODE, ids[seq - 1 + i : seq + i], torch.tensor([seq - 1 + i]),
                                 hidden)
            results[f"logits_{i}"] = logits
    save_file({k: v.contiguous() for k, v in results.items()}, out)
    print(f"sglang drafted {depth} steps over {seq} positions")
    return 0


if __name__ == "__main__":
    triples = sys.argv[1:]
    for n in range(0, len(triples), 3):
        main(*triples[n : n + 3], set_up=n == 0)

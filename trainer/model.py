"""The EAGLE-3 drafter: one Llama decoder layer over [token embedding; target features].

Parameter names follow SGLang's ``LlamaForCausalLMEagle3`` (``fc``, ``midlayer.*``, ``norm``,
``lm_head``, buffers ``d2t``/``t2d``), so export is a rename-free copy.

Training-time test (TTT): step 0 runs over every position of a sequence; step i > 0 feeds each
position the hidden state step i-1 produced there and the embedding of the token i places later.
A query of step i at position t attends to step 0's keys at positions <= t (the real context) and
to its own chain's keys of steps 1..i at position t, which is what the drafter sees at inference
when it drafts i tokens past a prefix ending at t. Rotary positions are t + i.

Architectures (``ARCHS``): ``eagle3`` as above; ``eagle3.1`` adds an RMSNorm on each captured
target hidden state before ``fc`` (``fc_norm.{k}``, SGLang's name) and feeds the next step the
post-``norm`` hidden state instead of the raw residual stream (``norm_output``), as SGLang's
draft decode does when the drafter's config.json sets both flags.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class DrafterConfig:
    """Shapes of a drafter; derived from the target's config plus the draft vocabulary."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int
    num_aux: int = 3
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    hidden_act: str = "silu"
    fc_norm: bool = False
    norm_output: bool = False
    target_extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_target_config(cls, target: dict[str, Any], draft_vocab_size: int, num_aux: int) -> DrafterConfig:
        """Build from a target's Hugging Face ``config.json`` (as a dict)."""
        hidden = int(target["hidden_size"])
        heads = int(target["num_attention_heads"])
        rope = target.get("rope_parameters") or {}
        theta = target.get("rope_theta") or rope.get("rope_theta") or 10000.0
        extra = {k: target[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in target}
        return cls(
            hidden_size=hidden,
            intermediate_size=int(target["intermediate_size"]),
            num_attention_heads=heads,
            num_key_value_heads=int(target.get("num_key_value_heads") or heads),
            head_dim=int(target.get("head_dim") or hidden // heads),
            vocab_size=int(target["vocab_size"]),
            draft_vocab_size=int(draft_vocab_size),
            num_aux=int(num_aux),
            rms_norm_eps=float(target.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            max_position_embeddings=int(target.get("max_position_embeddings", 2048)),
            hidden_act=str(target.get("hidden_act", "silu")),
            target_extra=extra,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def arch(self) -> str:
        """The architecture name these flags make (see ``ARCHS``)."""
        for name, (fc_norm, norm_output) in ARCHS.items():
            if (self.fc_norm, self.norm_output) == (fc_norm, norm_output):
                return name
        return f"eagle3(fc_norm={self.fc_norm},norm_output={self.norm_output})"

    def set_arch(self, arch: str) -> None:
        self.fc_norm, self.norm_output = ARCHS[arch]


# architecture name -> (fc_norm, norm_output)
ARCHS: dict[str, tuple[bool, bool]] = {"eagle3": (False, False), "eagle3.1": (True, True)}
DEFAULT_ARCH = "eagle3.1"


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Apply rotary embedding to ``x`` [B, heads, T, D] at ``positions`` [T] (rotate-half form)."""
    dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim))
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    half = dim // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    """Self-attention over a 2H input, with the TTT key layout (see module docstring)."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, h, kv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        self.q_proj = nn.Linear(2 * cfg.hidden_size, h * d, bias=False)
        self.k_proj = nn.Linear(2 * cfg.hidden_size, kv * d, bias=False)
        self.v_proj = nn.Linear(2 * cfg.hidden_size, kv * d, bias=False)
        self.o_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, query_index: torch.Tensor,
                cache: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """``x`` [B, T, 2H] at rotary ``positions`` [T]; ``query_index`` [T] is each query's
        position among step 0's keys. ``cache`` holds (k, v) of earlier steps: entry 0 spans the
        whole context, later entries are aligned with the queries. This step's (k, v) is appended.
        """
        cfg = self.cfg
        bsz, length, _ = x.shape
        q = self.q_proj(x).view(bsz, length, cfg.num_attention_heads, cfg.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(bsz, length, cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(bsz, length, cfg.num_key_value_heads, cfg.head_dim).transpose(1, 2)
        q = rotary(q, positions, cfg.rope_theta)
        k = rotary(k, positions, cfg.rope_theta)
        groups = cfg.num_attention_heads // cfg.num_key_value_heads
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        cache.append((k, v))
        scale = 1.0 / math.sqrt(cfg.head_dim)
        k0, v0 = cache[0]
        scores = torch.matmul(q, k0.transpose(-1, -2)) * scale  # [B, h, T, T0]
        key_index = torch.arange(k0.shape[2], device=x.device)
        future = key_index[None, :] > query_index[:, None]
        scores = scores.masked_fill(future, float("-inf"))
        chain = [(q * kj).sum(-1, keepdim=True) * scale for kj, _ in cache[1:]]  # each [B, h, T, 1]
        probs = torch.softmax(torch.cat([scores, *chain], dim=-1).float(), dim=-1).to(q.dtype)
        out = torch.matmul(probs[..., : k0.shape[2]], v0)
        for j, (_, vj) in enumerate(cache[1:]):
            out = out + probs[..., k0.shape[2] + j : k0.shape[2] + j + 1] * vj
        out = out.transpose(1, 2).reshape(bsz, length, cfg.num_attention_heads * cfg.head_dim)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    """The EAGLE-3 decoder layer: attention reads [norm(embedding); norm(hidden)]."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                query_index: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        residual = hidden
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        hidden = residual + self.self_attn(x, positions, query_index, cache)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Eagle3Drafter(nn.Module):
    """The drafter. ``embed_tokens`` is the target's embedding, frozen (not exported)."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)
        self.fc = nn.Linear(cfg.num_aux * cfg.hidden_size, cfg.hidden_size, bias=False)
        if cfg.fc_norm:  # EAGLE 3.1: one RMSNorm per captured layer, before fc
            norms = (RMSNorm(cfg.hidden_size, cfg.rms_norm_eps) for _ in range(cfg.num_aux))
            self.fc_norm = nn.ModuleList(norms)
        self.midlayer = MidLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        # d2t[i]: offset from draft id i to its target id; t2d[j]: target id j is in the draft vocab.
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))

    def set_vocab(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def step(self, token_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
             query_index: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]]
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """One drafting step. Returns (hidden state for the next step, logits over the draft vocab).
        With ``norm_output`` the next step gets the normed state the logits are read from."""
        embeds = self.embed_tokens(token_ids).to(hidden.dtype)
        out = self.midlayer(embeds, hidden, positions, query_index, cache)
        normed = self.norm(out)
        return (normed if self.cfg.norm_output else out), self.lm_head(normed)

    def project(self, aux_hidden: torch.Tensor) -> torch.Tensor:
        """Target features [.., K*H] -> the drafter's hidden size (each layer's slice normed
        first with ``fc_norm``)."""
        if self.cfg.fc_norm:
            chunks = aux_hidden.chunk(self.cfg.num_aux, dim=-1)
            aux_hidden = torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks, strict=True)], dim=-1)
        return self.fc(aux_hidden)

    def ttt_logits(self, aux_hidden: torch.Tensor, next_ids: torch.Tensor, length: int) -> list[torch.Tensor]:
        """Unrolled training-time test: ``aux_hidden`` [B, T, K*H] at positions 0..T-1 and
        ``next_ids`` [B, T + length - 1] (the token after each position, then further tokens,
        padded). Returns ``length`` logits tensors [B, T, draft_vocab]."""
        seq = aux_hidden.shape[1]
        index = torch.arange(seq, device=aux_hidden.device)
        hidden = self.project(aux_hidden)
        cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        logits = []
        for i in range(length):
            hidden, step_logits = self.step(next_ids[:, i : i + seq], hidden, index + i, index, cache)
            logits.append(step_logits)
        return logits

    @torch.no_grad()
    def draft_chain(self, aux_hidden: torch.Tensor, next_ids: torch.Tensor, depth: int) -> list[int]:
        """Greedy chain of ``depth`` target-vocab token ids after a context (batch of one).

        ``aux_hidden`` [1, n, K*H] are the target's features at positions 0..n-1 and ``next_ids``
        [1, n] the token that follows each of them (the last one is the target's own next token).
        """
        seq = aux_hidden.shape[1]
        index = torch.arange(seq, device=aux_hidden.device)
        cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        hidden, logits = self.step(next_ids, self.project(aux_hidden), index, index, cache)
        # After step 0 only the last position matters: shrink the chain to it.
        hidden, logits = hidden[:, -1:], logits[:, -1:]
        last = index[-1:]
        drafted: list[int] = []
        for i in range(depth):
            token = self.draft_to_target(logits[0, -1].argmax())
            drafted.append(int(token))
            if i + 1 == depth:
                break
            hidden, logits = self.step(token.view(1, 1), hidden, last + i + 1, last, cache)
        return drafted


def drafter_config_from_dict(data: dict[str, Any]) -> DrafterConfig:
    return DrafterConfig(**data)

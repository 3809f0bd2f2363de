"""Test helpers for the trainer: a tiny trained Llama target and contract-2 data made from it.

The target is trained for a few seconds on sequences from a sparse random Markov chain, so that
its predictions have structure a drafter can learn (a random-init target predicts noise).
The data writer runs the target with transformers and writes rows_*/data_*.ckpt plus a manifest
through hsmon.contracts.layout, the way `hsmon extract` does.
"""

from __future__ import annotations

import io
from pathlib import Path

import torch

from hsmon.contracts.layout import (
    append_jsonl,
    atomic_write,
    chunk_bounds,
    chunk_dir_name,
    manifest_name,
    row_path,
)

VOCAB = 48
LAYERS = 8


def markov_sequences(count: int, length: int, seed: int, vocab: int = VOCAB) -> list[list[int]]:
    """Sequences from a fixed sparse Markov chain (each token has 3 likely successors)."""
    chain = torch.Generator().manual_seed(1234)
    successors = torch.randint(3, vocab, (vocab, 3), generator=chain)
    weights = torch.tensor([0.7, 0.2, 0.1])
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        n = int(torch.randint(length // 2, length + 1, (1,), generator=gen))
        seq = [int(torch.randint(3, vocab, (1,), generator=gen))]
        for _ in range(n - 1):
            pick = int(torch.multinomial(weights, 1, generator=gen))
            seq.append(int(successors[seq[-1], pick]))
        out.append(seq)
    return out


def make_tiny_target(path: Path, train_steps: int = 150) -> Path:
    """A tiny Llama (8 layers, hidden 32) trained briefly on Markov sequences, saved to ``path``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if (path / "config.json").is_file():
        return path
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = markov_sequences(64, 48, seed=99)
    for step in range(train_steps):
        batch = [s[:24] for s in data[(step * 8) % 64:(step * 8) % 64 + 8]]
        ids = torch.tensor([s + [0] * (24 - len(s)) for s in batch])
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(path, safe_serialization=True)
    save_word_tokenizer(path)
    return path


def save_word_tokenizer(path: Path) -> None:
    """A word-level tokenizer over the tiny vocabulary (token i is the word ``t{i}``), so that tools
    that insist on a tokenizer (hsmon extract) accept the tiny target."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(path)


def capture_points(layers: int) -> list[int]:
    return [2, layers // 2, layers - 3]


@torch.no_grad()
def write_rows(target: Path, out: Path, sequences: list[list[int]], chunk_size: int = 8,
               manifest: bool = True, first_row: int = 0) -> list[Path]:
    """Run the target over ``sequences`` and write contract-2 rows (and manifest records)."""
    from transformers import LlamaForCausalLM

    from extractor.row_stats import layer_sums  # the per-layer stats hsmon extract records

    model = LlamaForCausalLM.from_pretrained(target).eval()
    points = capture_points(model.config.num_hidden_layers)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    records = []
    for offset, seq in enumerate(sequences):
        row = first_row + offset
        ids = torch.tensor([seq])
        result = model.model(input_ids=ids, output_hidden_states=True)
        aux = torch.cat([result.hidden_states[p] for p in points], dim=-1)
        mask = torch.ones(len(seq), dtype=torch.long)
        mask[: min(3, len(seq) // 2)] = 0  # a "prompt" that is not trained on
        payload = {"input_ids": ids[0].clone(), "loss_mask": mask,
                   "hidden_state": result.last_hidden_state.clone(),
                   "aux_hidden_state": aux.clone()}
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        path = row_path(out, row, chunk_size)
        size = atomic_write(path, lambda fh, b=buffer: fh.write(b.getbuffer()))
        paths.append(path)
        stats = {"final": layer_sums(result.last_hidden_state[0]),
                 **{str(p): layer_sums(result.hidden_states[p][0]) for p in points}}
        records.append({"type": "row", "row": row, "chunk": chunk_dir_name(*chunk_bounds(row, chunk_size)),
                        "tokens": len(seq), "bytes": size, "stats": stats})
    if manifest:
        append_jsonl(out / manifest_name(), [{"type": "run", "layers": points}, *records])
    return paths

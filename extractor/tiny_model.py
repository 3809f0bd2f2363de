"""A tiny random Llama with a byte-level BPE tokenizer, for tests and benchmarks.

Built in about a second from Python's standard-library sources; untrained (random weights with
a fixed seed). The embedded target (extractor.embedded_target) is the trained default model.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def stdlib_text(max_chars: int = 400_000) -> str:
    """Some text that is on every machine with Python: standard-library sources."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts, total = [], 0
    for name in ("argparse.py", "json/decoder.py", "textwrap.py", "string.py", "difflib.py", "csv.py",
                 "shutil.py", "calendar.py"):
        path = root / name
        if path.is_file():
            text = path.read_text(encoding="utf-8", errors="replace")
            parts.append(text)
            total += len(text)
        if total >= max_chars:
            break
    return "".join(parts)[:max_chars]


def write_tokenizer(out: Path, vocab_size: int = 512,
                    chat_template: str | None = None) -> tuple[int, int, int]:
    """A byte-level BPE tokenizer trained on stdlib text, saved in ``out``: (vocab, bos, eos) ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    specials = ["<pad>", "<s>", "</s>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(stdlib_text().splitlines(keepends=True), trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B",
                                                       special_tokens=[("<s>", bos)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    if chat_template:
        fast.chat_template = chat_template
    fast.save_pretrained(out)
    return tok.get_vocab_size(), bos, tok.token_to_id("</s>")


def make_tiny_llama(out_dir: str | Path, num_layers: int = 8, hidden_size: int = 64, vocab_size: int = 512,
                    chat_template: str | None = None, seed: int = 0, max_positions: int = 1024) -> Path:
    """Write a random LlamaForCausalLM and its tokenizer to ``out_dir``; returns the directory."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    vocab, bos, eos = write_tokenizer(out, vocab_size, chat_template)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden_size,
                         intermediate_size=hidden_size * 2, num_hidden_layers=num_layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                         bos_token_id=bos, eos_token_id=eos, pad_token_id=0,
                         tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    return out

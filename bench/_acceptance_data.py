"""The drafter acceptance bench's data: standard-library sources split as the embedded target's
corpus is, snippets of them, chat requests, and rows of the target's own greedy continuations."""

from __future__ import annotations

import random
import sysconfig
import zlib
from pathlib import Path

EXCLUDED_DIRS = {"test", "tests", "site-packages", "dist-packages", "idle_test"}


def stdlib_files() -> tuple[list[Path], list[Path]]:
    """(train, held-out) standard-library sources, split as the embedded target's corpus is."""
    root = Path(sysconfig.get_paths()["stdlib"])
    train, held = [], []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        parts = rel.split("/")
        if any(p in EXCLUDED_DIRS for p in parts[:-1]) or parts[-1].startswith("test_"):
            continue
        (held if zlib.crc32(rel.encode()) % 10 == 0 else train).append(path)
    return train, held


def snippets(files: list[Path], count: int, chars: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        text = rng.choice(files).read_text(errors="replace")
        if len(text) < chars:
            continue
        start = rng.randrange(0, len(text) - chars + 1)
        out.append(text[start : start + chars])
    return out


def self_distilled_rows(
    target: Path, texts: list[str], prompt_tokens: int, new_tokens: int, threads: int
) -> list[dict]:
    """Rows of prompt tokens + the target's greedy continuation (loss on the continuation)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    prompts = [ids[:prompt_tokens] for ids in tok(texts, add_special_tokens=False)["input_ids"]]
    prompts = [p for p in prompts if len(p) == prompt_tokens]
    rows = []
    batch = 32
    with torch.no_grad():
        for i in range(0, len(prompts), batch):
            ids = torch.tensor(prompts[i : i + batch])
            out = model.generate(
                ids,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
            )
            for row in out.tolist():
                rows.append(
                    {"input_ids": row, "loss_mask": [0] * prompt_tokens + [1] * (len(row) - prompt_tokens)}
                )
    return rows


def chat_requests(files: list[Path], count: int, seed: int, max_code_chars: int = 1500) -> list[str]:
    """Requests "Write a Python function `name`: <docstring's first paragraph>" from ``files``."""
    from extractor.target_text import function_requests

    requests = [request for _, request, _ in function_requests(files, max_code_chars)]
    random.Random(seed).shuffle(requests)
    return requests[:count]


def self_distilled_chat_rows(target: Path, requests: list[str], new_tokens: int, threads: int) -> list[dict]:
    """Rows of a chat request (template + generation prompt), then the target's greedy answer (loss)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(target)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    prompts = [
        list(tok.apply_chat_template([{"role": "user", "content": r}], add_generation_prompt=True,
                                     tokenize=True, return_dict=True)["input_ids"])
        for r in requests
    ]  # fmt: skip
    eos, pad = tok.eos_token_id, tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    rows = []
    batch = 16
    with torch.no_grad():
        for i in range(0, len(prompts), batch):
            group = prompts[i : i + batch]
            width = max(len(p) for p in group)
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in group])  # left padding
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
            out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=pad)  # fmt: skip
            for prompt, row in zip(group, out[:, width:].tolist(), strict=True):
                answer = row[: row.index(eos) + 1] if eos in row else row
                mask = [0] * len(prompt) + [1] * len(answer)
                rows.append({"input_ids": prompt + answer, "loss_mask": mask})
    return rows

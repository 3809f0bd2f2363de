"""Shared pieces of the `hsmon regenerate` tests: chat datasets, real subprocesses, and the reference
answers drawn by transformers itself (greedy, on the same weights)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from hsmon.contracts import layout, regen_layout

ROOT = Path(__file__).resolve().parents[1]
EMBEDDED = ROOT / "extractor" / "embedded"
NEW_TOKENS = 24
TIMEOUT = 300


def requests_of(count: int, start: int = 0) -> list[tuple[str, str]]:
    """(request, the function's source) pairs: "Write a Python function `name`: <docstring>"."""
    import itertools

    from extractor.target_text import corpus_files, function_requests

    train, _ = corpus_files()
    pairs = itertools.islice(function_requests(train[:80], 600), start, start + count)
    return [(request, code) for _, request, code in pairs]


def chat_rows(count: int, start: int = 0) -> list[dict[str, Any]]:
    """Conversations of every shape a regeneration answers: one turn, two turns (OpenAI and ShareGPT
    names), a system turn, a last user turn without an answer."""
    pairs = requests_of(count + 2, start)
    rows: list[dict[str, Any]] = []
    for i in range(count):
        request, code = pairs[i]
        shape = i % 4
        if shape == 0:
            conv = [{"role": "user", "content": request}, {"role": "assistant", "content": code}]
        elif shape == 1:
            other, other_code = pairs[i + 1]
            conv = [{"from": "human", "value": request}, {"from": "gpt", "value": code},
                    {"from": "human", "value": other}, {"from": "gpt", "value": other_code}]
        elif shape == 2:
            conv = [{"role": "system", "content": "Answer with code only."},
                    {"role": "user", "content": request}, {"role": "assistant", "content": code}]
        else:
            conv = [{"role": "user", "content": request}]
        rows.append({"id": f"row-{start + i}", "conversations": conv})
    return rows


BAD_ROWS = [
    '{"conversations": [{"role": "assistant", "content": "I start"}, {"role": "user", "content": "x"}]}',
    '{"conversations": [{"role": "system", "content": "only a system turn"}]}',
    '{"text": "a text row"}',
    "not json",
]


def write_rows(path: Path, rows: list[dict[str, Any]], bad: list[str] | None = None,
               bad_every: int = 0) -> Path:
    lines = [json.dumps(r) for r in rows]
    for k, line in enumerate(bad or []):
        lines.insert(min(len(lines), (k + 1) * bad_every), line)
    path.write_text("\n".join(lines) + "\n")
    return path


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **extra}


def regen_cmd(data: Path, out: Path, *extra: str, events: Path | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "hsmon", "regenerate", str(data), "--out", str(out), "--max-new-tokens",
           str(NEW_TOKENS), "--min-free", "1M", "--heartbeat", "0.5", "--disk-poll", "0.2",
           *extra]
    return cmd + (["--events", str(events)] if events is not None else [])


def run_regenerate(data: Path, out: Path, *extra: str, events: Path | None = None,
                   **env_extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(regen_cmd(data, out, *extra, events=events), capture_output=True, text=True,
                          timeout=TIMEOUT, env=env(**env_extra))


def start_regenerate(data: Path, out: Path, *extra: str, events: Path | None = None,
                     **env_extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(regen_cmd(data, out, *extra, events=events), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env(**env_extra))


def dataset_rows(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / regen_layout.DATA_NAME).read_text().splitlines()]


def manifest(out: Path) -> list[dict[str, Any]]:
    return list(layout.iter_jsonl(out / regen_layout.MANIFEST_NAME))


def transformers_answers(rows: list[dict[str, Any]], model_dir: Path = EMBEDDED,
                         new_tokens: int = NEW_TOKENS) -> list[list[str]]:
    """Each row's answers as transformers' greedy ``generate`` draws them on the same weights, turn
    by turn, each given the earlier answers: the bar a regeneration must equal."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    stop = [2, 6]  # the embedded target's <|eos|> and the <|end|> that closes an assistant turn
    answers = []
    for row in rows:
        history: list[dict[str, str]] = []
        said = []
        messages = [{"role": {"human": "user", "gpt": "assistant"}.get(m.get("from"), m.get("role")),
                     "content": m.get("content", m.get("value"))} for m in row["conversations"]]
        if messages[-1]["role"] == "user":
            messages.append({"role": "assistant", "content": ""})
        for message in messages:
            if message["role"] != "assistant":
                history.append(message)
                continue
            text = tok.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
            ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
            with torch.no_grad():
                out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, eos_token_id=stop,
                                     pad_token_id=0)
            new = out[0, ids.shape[1]:].tolist()
            if new and new[-1] in stop:
                new = new[:-1]
            answer = tok.decode(new, skip_special_tokens=True)
            said.append(answer)
            history.append({"role": "assistant", "content": answer})
        answers.append(said)
    return answers


def answers_of(row: dict[str, Any]) -> list[str]:
    return [m["content"] for m in row["conversations"] if m["role"] == "assistant"]

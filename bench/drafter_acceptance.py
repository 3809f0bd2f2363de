"""The whole drafter pipeline on the embedded target, on CPU: data, extraction, training, acceptance.

1. Training prompts: snippets of the Python standard library files the embedded target was trained
   on; each row is a snippet's first tokens (loss mask 0) followed by the target's own greedy
   continuation (loss mask 1), as EAGLE-3 trains on the target's responses.
2. `hsmon extract` writes their hidden states; `hsmon train` trains the drafter (time-boxed by
   --max-steps; the wall time is printed); `hsmon export-drafter` exports it.
3. `hsmon eval-drafter` measures the mean acceptance length on prompts from the held-out files
   (CRC-32 of the path = 0 mod 10, never seen by the target or the drafter), beside the
   prompt-lookup n-gram drafter on the same prompts.

With `--target smollm2` (the real SmolLM2-135M-Instruct, `hsmon make-target --preset smollm2`) the
rows are chat requests ("Write a Python function `name`: <docstring>", functions of the training
files) rendered with its ChatML template, followed by its own greedy answer; the held-out prompts are
the same kind of request for functions of the held-out files; fewer rows and shorter answers, the
same training budget.

usage: python bench/drafter_acceptance.py [--target embedded|smollm2] [--target-model DIR] [--rows N] ...
Last line: RESULT eagle3_d1=... eagle3_d7=... ngram_d1=... ngram_d7=... ratio_d7=... train_s=...
           target=... gen_tok_s=... extract_tok_s=... train_tok_s=... eval_fwd_s=...
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import sysconfig
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
EXCLUDED_DIRS = {"test", "tests", "site-packages", "dist-packages", "idle_test"}


PROFILES = {
    "embedded": {"rows": 768, "new_tokens": 192, "max_steps": 450, "eval_prompts": 16, "eval_new_tokens": 64},
    # a real 135 M model on 2 shared cores: fewer rows and prompts (eval re-runs the whole sequence per
    # verifying forward), the same training budget
    "smollm2": {"rows": 128, "new_tokens": 128, "max_steps": 400, "eval_prompts": 6, "eval_new_tokens": 48},
}


def read_events(path: Path) -> list[dict]:
    from hsmon.contracts.events import iter_events

    return list(iter_events(path))


def eval_forwards(result: dict, eagle: dict, ngram: dict) -> float:
    """Target forwards eval-drafter ran: one per round (tokens / acceptance length) per variant, plus
    the plain greedy reference (one per token) and each variant's prefill."""
    tokens = result["prompts"] * result["max_new_tokens"]
    variants = list(eagle.values()) + list(ngram.values())
    return tokens + sum(tokens / a for a in variants) + result["prompts"] * (len(variants) + 1)


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


def hsmon(*args: str, threads: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads)}
    subprocess.run([sys.executable, "-m", "hsmon", *args], check=True, cwd=ROOT, env=env)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", choices=sorted(PROFILES), default="embedded",
                        help="target preset and its row kind (default embedded)")  # fmt: skip
    parser.add_argument("--target-model", default=None, help="a model directory instead of the preset's")
    parser.add_argument("--rows", type=int, default=None, help="training rows (768; smollm2 128)")
    parser.add_argument("--prompt-tokens", type=int, default=64, help="embedded: snippet tokens per row")
    parser.add_argument("--new-tokens", type=int, default=None, help="target tokens a row (192; smollm2 128)")
    parser.add_argument("--max-steps", type=int, default=None, help="optimizer steps (450; smollm2 400)")
    parser.add_argument("--time-limit", type=float, default=570,
                        help="seconds of training steps at most (the process also scans and evaluates)")
    parser.add_argument("--draft-vocab-size", type=int, default=1024)
    parser.add_argument("--batch-tokens", type=int, default=2048)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--eval-prompts", type=int, default=None, help="held-out prompts (16; smollm2 6)")
    parser.add_argument("--eval-new-tokens", type=int, default=None, help="tokens a prompt (64; smollm2 48)")
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--work", default=None, help="keep everything here (default: a temporary directory)")
    args = parser.parse_args()
    for key, value in PROFILES[args.target].items():
        if getattr(args, key) is None:
            setattr(args, key, value)

    from trainer.target import resolve_target

    target = resolve_target(args.target_model or args.target)
    chat = args.target == "smollm2"
    train_files, held_files = stdlib_files()
    with tempfile.TemporaryDirectory(prefix="hsmon-bench-accept-") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        if chat:
            requests = chat_requests(train_files, args.rows, seed=1)
            rows = self_distilled_chat_rows(target, requests, args.new_tokens, args.threads)
        else:
            texts = snippets(train_files, args.rows, 1200, seed=1)
            rows = self_distilled_rows(target, texts, args.prompt_tokens, args.new_tokens, args.threads)
        generated = sum(sum(r["loss_mask"]) for r in rows)
        dataset = work / "train.jsonl"
        dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
        made = time.perf_counter() - started
        started = time.perf_counter()
        hsmon(
            "extract",
            str(dataset),
            "--out",
            str(work / "data"),
            "--model",
            str(target),
            "--events",
            str(work / "extract.jsonl"),
            threads=args.threads,
        )
        extracted = time.perf_counter() - started
        started = time.perf_counter()
        hsmon(
            "train",
            str(work / "data"),
            "--target-model",
            str(target),
            "--out",
            str(work / "run"),
            "--max-steps",
            str(args.max_steps),
            "--batch-tokens",
            str(args.batch_tokens),
            "--lr",
            str(args.lr),
            "--events",
            str(work / "train.jsonl.events"),
            "--threads",
            str(args.threads),
            "--checkpoint-every",
            "500",
            "--time-limit",
            str(args.time_limit),
            "--draft-vocab-size",
            str(args.draft_vocab_size),
            threads=args.threads,
        )
        train_s = time.perf_counter() - started
        hsmon("export-drafter", str(work / "run"), "--out", str(work / "drafter"), threads=args.threads)
        prompts = work / "prompts.jsonl"
        if chat:
            held = [{"messages": [{"role": "user", "content": r}]}
                    for r in chat_requests(held_files, args.eval_prompts, seed=7)]  # fmt: skip
        else:
            held = [{"text": t} for t in snippets(held_files, args.eval_prompts, 400, seed=7)]
        prompts.write_text("".join(json.dumps(p) + "\n" for p in held))
        evaluating = time.perf_counter()
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "hsmon",
                "eval-drafter",
                "--drafter",
                str(work / "drafter"),
                "--target-model",
                str(target),
                "--prompts",
                str(prompts),
                "--depth",
                "7",
                "--max-new-tokens",
                str(args.eval_new_tokens),
                "--json",
                "--threads",
                str(args.threads),
            ],
            check=True,
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        result = json.loads(proc.stdout)
        eval_s = time.perf_counter() - evaluating
        extract_done = [e for e in read_events(work / "extract.jsonl") if e["kind"] == "done"][-1]
        train_events = read_events(work / "train.jsonl.events")
        train_done = [e for e in train_events if e["kind"] == "done"][-1]
        train_start = [e for e in train_events if e["kind"] == "start"][-1]
    eagle, ngram = result["acceptance_length"]["eagle3"], result["acceptance_length"]["ngram"]
    rates = {
        "gen_tok_s": generated / made,
        "extract_tok_s": extract_done["tokens_done"] / max(extract_done["seconds"], 1e-9),
        "train_tok_s": train_done["tokens"] / max(train_done["ts"] - train_start["ts"], 1e-9),
        "eval_fwd_s": eval_forwards(result, eagle, ngram) / eval_s,
    }
    kind = "chat request + own answer" if chat else f"{args.prompt_tokens} prompt + {args.new_tokens} target"
    print(
        f"target {args.target} ({target}); {len(rows)} training rows ({kind} tokens, {generated} generated "
        f"in {made:.0f} s: {rates['gen_tok_s']:.0f} tok/s); extracted in {extracted:.0f} s "
        f"({rates['extract_tok_s']:.0f} tok/s); training {train_s:.0f} s, {train_done['step']} of "
        f"{args.max_steps} steps, {train_done['tokens']} tokens ({rates['train_tok_s']:.0f} tok/s), "
        f"{args.threads} threads; eval {eval_s:.0f} s ({rates['eval_fwd_s']:.1f} target forwards/s)"
    )
    print(
        f"held-out prompts: {result['prompts']}, {result['max_new_tokens']} new tokens each; outputs equal "
        f"plain greedy: {result['outputs_match_greedy']}"
    )
    print("depth  eagle3  ngram   (mean acceptance length: tokens per target forward)")
    for d in range(1, 8):
        print(f"{d:>5}  {eagle[str(d)]:6.3f}  {ngram[str(d)]:6.3f}")
    print(
        f"RESULT eagle3_d1={eagle['1']:.3f} eagle3_d7={eagle['7']:.3f} ngram_d1={ngram['1']:.3f} "
        f"ngram_d7={ngram['7']:.3f} ratio_d7={eagle['7'] / ngram['7']:.3f} train_s={train_s:.0f} "
        f"target={args.target} " + " ".join(f"{k}={v:.1f}" for k, v in rates.items())
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

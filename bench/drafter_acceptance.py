"""The whole drafter pipeline on the embedded target, on CPU: data, extraction, training, acceptance.

1. Training prompts: snippets of the Python standard library files the embedded target was trained
   on; each row is a snippet's first tokens (loss mask 0) followed by the target's own greedy
   continuation (loss mask 1), as EAGLE-3 trains on the target's responses.
2. `hsmon extract` writes their hidden states; `hsmon train` trains the drafter (time-boxed by
   --max-steps; the wall time is printed); `hsmon export-drafter` exports it.
3. `hsmon eval-drafter` measures the mean acceptance length on prompts from the held-out files
   (CRC-32 of the path = 0 mod 10, never seen by the target or the drafter), beside the
   prompt-lookup n-gram drafter on the same prompts.

usage: python bench/drafter_acceptance.py [--target-model DIR] [--rows N] [--max-steps N] ...
Last line: RESULT eagle3_d1=... eagle3_d7=... ngram_d1=... ngram_d7=... train_s=... ratio_d7=...
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


def hsmon(*args: str, threads: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads)}
    subprocess.run([sys.executable, "-m", "hsmon", *args], check=True, cwd=ROOT, env=env)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target-model", default=None, help="default: the embedded target")
    parser.add_argument("--rows", type=int, default=768, help="training rows")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=192, help="target continuation per row")
    parser.add_argument("--max-steps", type=int, default=450)
    parser.add_argument("--time-limit", type=float, default=570,
                        help="seconds of training steps at most (the process also scans and evaluates)")
    parser.add_argument("--draft-vocab-size", type=int, default=1024)
    parser.add_argument("--batch-tokens", type=int, default=2048)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--eval-prompts", type=int, default=16)
    parser.add_argument("--eval-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--work", default=None, help="keep everything here (default: a temporary directory)")
    args = parser.parse_args()

    from trainer.target import resolve_target

    target = resolve_target(args.target_model)
    train_files, held_files = stdlib_files()
    with tempfile.TemporaryDirectory(prefix="hsmon-bench-accept-") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        rows = self_distilled_rows(
            target,
            snippets(train_files, args.rows, 1200, seed=1),
            args.prompt_tokens,
            args.new_tokens,
            args.threads,
        )
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
        prompts.write_text(
            "".join(
                json.dumps({"text": t}) + "\n" for t in snippets(held_files, args.eval_prompts, 400, seed=7)
            )
        )
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
    eagle, ngram = result["acceptance_length"]["eagle3"], result["acceptance_length"]["ngram"]
    print(
        f"target {target}; {len(rows)} training rows ({args.prompt_tokens} prompt + {args.new_tokens} "
        f"target tokens) made in {made:.0f} s, extracted in {extracted:.0f} s; training {train_s:.0f} s "
        f"({args.max_steps} steps, {args.threads} threads)"
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
        f"ngram_d7={ngram['7']:.3f} ratio_d7={eagle['7'] / ngram['7']:.3f} train_s={train_s:.0f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

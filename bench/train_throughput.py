"""Training throughput of `hsmon train` on CPU, and the share of step time spent waiting for data.

Makes a dataset in the extraction layout from the target (the embedded target, or --target-model),
runs `hsmon train` on it as a user would (rows read from disk by the background prefetcher), and,
in the same run, the same training steps over batches already in memory (no I/O at all) as the
baseline. Goal: data_wait_frac < 0.10 and the ratio to the in-memory baseline close to 1.

usage: python bench/train_throughput.py [--target-model DIR] [--rows N] [--steps N] [--threads N]
Last line: RESULT train_tok_s=... data_wait_frac=... inmem_tok_s=... ratio=...
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def resolve_bench_target(path: str | None, work: Path) -> Path:
    if path:
        return Path(path)
    try:
        from extractor.embedded_target import ensure_embedded_target

        return Path(ensure_embedded_target())
    except ImportError:
        from train_helpers import make_tiny_target

        print("(no embedded target in this build: using the tests' tiny target)")
        return make_tiny_target(work / "tiny-target")


def make_rows(target: Path, data: Path, rows: int, length: int) -> None:
    import json as _json

    from train_helpers import write_rows

    vocab = _json.loads((target / "config.json").read_text())["vocab_size"]
    import torch

    gen = torch.Generator().manual_seed(0)
    seqs = [
        torch.randint(
            3, vocab, (int(torch.randint(length // 2, length + 1, (1,), generator=gen)),), generator=gen
        ).tolist()
        for _ in range(rows)
    ]
    write_rows(target, data, seqs, chunk_size=64)


def run_train(target: Path, data: Path, out: Path, steps: int, batch_tokens: int, threads: int) -> list[dict]:
    events = out.with_suffix(".jsonl")
    cmd = [
        sys.executable,
        "-m",
        "hsmon",
        "train",
        str(data),
        "--target-model",
        str(target),
        "--out",
        str(out),
        "--max-steps",
        str(steps),
        "--batch-tokens",
        str(batch_tokens),
        "--events",
        str(events),
        "--threads",
        str(threads),
        "--lr",
        "1e-3",
        "--checkpoint-every",
        "0",
        "--eval-fraction",
        "0",
    ]
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return [json.loads(line) for line in events.read_text().splitlines()]


def in_memory_baseline(target: Path, data: Path, steps: int, batch_tokens: int, threads: int) -> float:
    """Tokens/s of the same loop over batches loaded beforehand (the no-I/O ceiling)."""
    import torch

    from trainer.data import build_draft_vocab, build_index, collate, plan_epoch
    from trainer.model import DrafterConfig, Eagle3Drafter
    from trainer.objective import TTTForward, ttt_loss
    from trainer.target import load_embed_and_head, load_target_config

    torch.set_num_threads(threads)
    index = build_index(data)
    rows = index.rows
    plan = plan_epoch(rows, batch_tokens, seed=0, epoch=0)
    batches = [collate([rows[i] for i in b]) for b in (plan * (steps // len(plan) + 1))[:steps]]
    cfg = DrafterConfig.from_target_config(load_target_config(target), 0, index.num_aux)
    d2t, t2d = build_draft_vocab(index.token_counts, cfg.vocab_size, None)
    cfg.draft_vocab_size = int(d2t.shape[0])
    drafter = Eagle3Drafter(cfg)
    embed, head = load_embed_and_head(target)
    with torch.no_grad():
        drafter.embed_tokens.weight.copy_(embed)
    drafter.set_vocab(d2t, t2d)
    forward = TTTForward(drafter)
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3)
    draft_ids = torch.nonzero(t2d).flatten()
    device = torch.device("cpu")
    warm = min(3, steps // 4)
    tokens, start = 0, None
    for i, batch in enumerate(batches):
        if i == warm:
            tokens, start = 0, time.perf_counter()
        opt.zero_grad()
        loss, _ = ttt_loss(forward, batch, head, draft_ids, 7, device, False)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        opt.step()
        tokens += batch.real_tokens
    return tokens / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target-model", default=None)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-tokens", type=int, default=2048)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads for both runs (1: steady figures on a shared machine)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hsmon-bench-train-") as tmp:
        work = Path(tmp)
        target = resolve_bench_target(args.target_model, work)
        data = work / "data"
        started = time.perf_counter()
        make_rows(target, data, args.rows, args.length)
        print(f"target {target}; dataset {args.rows} rows made in {time.perf_counter() - started:.1f} s")
        events = run_train(target, data, work / "run", args.steps, args.batch_tokens, args.threads)
        steps = [e for e in events if e["kind"] == "step"]
        measured = steps[min(3, len(steps) // 4) :]  # skip the first steps (allocation, first reads)
        train_tok_s = statistics.fmean(e["tokens_s"] for e in measured)
        wait = statistics.fmean(e["data_wait_frac"] for e in measured)
        inmem = in_memory_baseline(target, data, args.steps, args.batch_tokens, args.threads)
    ratio = train_tok_s / inmem
    print(
        f"hsmon train (rows read from disk):  {train_tok_s:10.0f} tokens/s, waiting for data {wait:.1%} "
        f"of step time (goal < 10%)"
    )
    print(f"same steps, batches in memory:     {inmem:10.0f} tokens/s")
    print(f"ratio to the in-memory baseline:   {ratio:10.2f}")
    print(
        f"RESULT train_tok_s={train_tok_s:.0f} data_wait_frac={wait:.4f} inmem_tok_s={inmem:.0f} "
        f"ratio={ratio:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Extraction throughput against a bare forward pass of the same model over the same rows.

    python bench/extract_overhead.py [--model DIR] [--rows 150] [--repeats 5] [--threads 1]

Baseline: the decoder's forward pass alone over exactly the batches the extractor forms (same
rows, token budget, chunking), in a subprocess started like the extraction (so both pay the same
process conditions). Extraction: a real `hsmon extract` subprocess writing to a temporary
directory on the same disk. Both rates are tokens over the timed loop only: for extraction the
time from its `start` event to its `done` event (model loading excluded, final writes
included), for the baseline the loop over the batches after one warm-up batch. Repeats are
interleaved so that machine noise hits both alike; the best of each is reported.

Peak RSS: `hsmon extract` on a small and a 4x larger dataset, each in its own subprocess
(os.wait4's ru_maxrss); memory must not grow with the dataset.

Ends with: RESULT extract_tok_s=... forward_tok_s=... ratio=... rss_small_mb=... rss_large_mb=...
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHUNK_SIZE = 2000
BATCH_TOKENS = 4096


def pick_model(arg: str | None, scratch: Path) -> tuple[Path, str]:
    if arg:
        return Path(arg), "given"
    try:
        from extractor.embedded_target import ensure_embedded_target

        return Path(ensure_embedded_target()), "embedded target"
    except ImportError:
        from extractor.tiny_model import make_tiny_llama

        return make_tiny_llama(scratch / "bench-model", num_layers=8, hidden_size=256), \
            "random Llama, 8 layers, hidden 256 (embedded target not in this build)"


def make_rows(path: Path, rows: int, seed: int = 0) -> Path:
    import random

    from extractor.tiny_model import stdlib_text

    rng = random.Random(seed)
    lines = [line for line in stdlib_text().splitlines() if line.strip()]
    with open(path, "w", encoding="utf-8") as fh:
        for _ in range(rows):
            k = rng.randint(10, 30)
            j = rng.randint(0, len(lines) - k)
            fh.write(json.dumps({"text": "\n".join(lines[j:j + k])}) + "\n")
    return path


def forward_worker(model: str, data: str, threads: int) -> None:
    """Subprocess body of the baseline: prints '<tokens> <seconds>' of the bare forward loop."""
    import torch
    from transformers import AutoTokenizer

    from extractor import dataset as ds
    from extractor.backends.hf import HFBackend
    from extractor.plan import plan_batches

    if threads:
        torch.set_num_threads(threads)
    backend = HFBackend(model, device="auto", dtype="auto")
    tokenizer = AutoTokenizer.from_pretrained(model)
    limits = ds.Limits(backend.info.vocab_size, backend.info.max_positions)
    rows = list(ds.iter_rows(data, tokenizer, limits, range(1 << 30)))
    batches = [[rows[p].input_ids for p in b] for b in plan_batches(
        [r.index for r in rows], [len(r.input_ids) for r in rows], CHUNK_SIZE, BATCH_TOKENS)]
    # warm-up; the extraction times its cold first batch, so this favours the baseline
    backend.bare_forward(batches[0])
    started = time.perf_counter()
    for batch in batches:
        backend.bare_forward(batch)
    print(sum(len(r.input_ids) for r in rows), time.perf_counter() - started)


def bare_forward_tok_s(model: Path, data: Path, threads: int) -> tuple[float, int]:
    out = subprocess.run([sys.executable, __file__, "--forward-worker", str(model), str(data), str(threads)],
                         env=bench_env(), capture_output=True, text=True, check=True)
    tokens, seconds = out.stdout.split()[-2:]
    return int(tokens) / float(seconds), int(tokens)


def bench_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def run_extract(model: Path, data: Path, out: Path, threads: int) -> tuple[float, int, float]:
    """(tokens/s between start and done, tokens, peak RSS MB) of one `hsmon extract` process."""
    events = out.with_suffix(".events.jsonl")
    cmd = [sys.executable, "-m", "hsmon", "extract", str(data), "--out", str(out), "--model", str(model),
           "--events", str(events), "--chunk-size", str(CHUNK_SIZE), "--batch-tokens", str(BATCH_TOKENS),
           "--min-free", "100M"] + (["--threads", str(threads)] if threads else [])
    proc = subprocess.Popen(cmd, env=bench_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"hsmon extract failed: {proc.stderr.read().decode() if proc.stderr else ''}")
    evs = [json.loads(line) for line in events.read_text().splitlines()]
    start = next(e for e in evs if e["kind"] == "start")
    done = evs[-1]
    assert done["kind"] == "done", done
    return done["tokens_done"] / (done["ts"] - start["ts"]), done["tokens_done"], usage.ru_maxrss / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model")
    parser.add_argument("--rows", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for both (default 1: the writer gets its own core, as it does "
                        "when the model runs on a GPU; 0 = torch's default)")
    parser.add_argument("--forward-worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.forward_worker:
        forward_worker(args.forward_worker[0], args.forward_worker[1], int(args.forward_worker[2]))
        return 0
    with tempfile.TemporaryDirectory(prefix="hsmon-bench-", dir=os.environ.get("BENCH_DIR")) as tmp:
        scratch = Path(tmp)
        model, what = pick_model(args.model, scratch)
        print(f"model: {model} ({what}); threads: {args.threads or 'torch default'}")
        data = make_rows(scratch / "rows.jsonl", args.rows)
        forward, extract = [], []
        for i in range(args.repeats):
            fwd, tokens = bare_forward_tok_s(model, data, args.threads)
            forward.append(fwd)
            ext, ext_tokens, _ = run_extract(model, data, scratch / f"out{i}", args.threads)
            extract.append(ext)
            assert ext_tokens == tokens, (ext_tokens, tokens)
            print(f"  repeat {i}: forward {fwd:,.0f} tok/s, extract {ext:,.0f} tok/s over {tokens} tokens")
        best_fwd, best_ext = max(forward), max(extract)
        ratio = best_ext / best_fwd
        print(f"bare forward: {best_fwd:,.0f} tok/s; extraction: {best_ext:,.0f} tok/s; ratio {ratio:.3f} "
              f"(goal >= 0.90)")
        small_rows, large_rows = max(args.rows // 4, 20), max(args.rows // 4, 20) * 4
        _, small_tok, rss_small = run_extract(model, make_rows(scratch / "small.jsonl", small_rows, 1),
                                              scratch / "rss-small", args.threads)
        _, large_tok, rss_large = run_extract(model, make_rows(scratch / "large.jsonl", large_rows, 2),
                                              scratch / "rss-large", args.threads)
        print(f"peak RSS: {rss_small:.0f} MB for {small_rows} rows ({small_tok} tokens), "
              f"{rss_large:.0f} MB for {large_rows} rows ({large_tok} tokens)")
    print(f"RESULT extract_tok_s={best_ext:.0f} forward_tok_s={best_fwd:.0f} ratio={ratio:.3f} "
          f"rss_small_mb={rss_small:.0f} rss_large_mb={rss_large:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

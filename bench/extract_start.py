"""How long `hsmon extract` takes to write its first row on the original job: 10,000 conversations of
~2,100 tokens. Before the first row it scans (tokenizes) the whole dataset to plan bytes
and disk; that scan is what grows with the dataset.

Builds a ShareGPT dataset (3 user/assistant pairs a row, text cut from Python's standard library,
sized by the target's own tokenizer), then:
- the scan in this process, batched as `hsmon extract` now runs it, against the baseline of the
  same rows parsed one by one with offsets and the loss mask (as the scan did before), on the
  first ``--compare-rows`` rows;
- a real `hsmon extract` with an events file: seconds from its start to its first `rows` event
  (then it is stopped with SIGTERM, as a user would).

    .venv/bin/python bench/extract_start.py [--rows 10000] [--model embedded|smollm2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from extractor import dataset as ds  # noqa: E402
from extractor.targets import resolve_model  # noqa: E402

PAIRS = 3


def make_dataset(path: Path, rows: int, tokens: int, tokenizer: object, seed: int = 0) -> None:
    """``rows`` conversations of about ``tokens`` tokens each (by the target's tokenizer)."""
    source = Path(sysconfig.get_paths()["stdlib"])
    text = "".join(p.read_text(errors="replace") for p in sorted(source.glob("*.py"))[:200])
    sample = text[:200_000]
    chars_per_token = len(sample) / len(tokenizer(sample)["input_ids"])  # type: ignore[operator]
    turn = int(tokens * chars_per_token / (2 * PAIRS))
    rng = random.Random(seed)
    with open(path, "w") as fh:
        for _ in range(rows):
            conv = []
            for _ in range(PAIRS):
                for role, size in (("human", turn * 2 // 3), ("gpt", turn * 4 // 3)):
                    start = rng.randrange(0, len(text) - size)
                    conv.append({"from": role, "value": text[start:start + size]})
            fh.write(json.dumps({"conversations": conv}) + "\n")


def per_row_scan(path: Path, tokenizer: object, limits: ds.Limits, rows: int) -> tuple[float, float]:
    """(wall, CPU) seconds to parse the first ``rows`` rows one by one, ids, offsets and mask (as the
    scan did before, with today's mask)."""
    started, cpu = time.perf_counter(), time.process_time()
    for index, line_no, raw in ds.iter_lines(path):
        if index >= rows:
            break
        ds.parse_row(raw, index, tokenizer, limits, line_no)  # type: ignore[arg-type]
    return time.perf_counter() - started, time.process_time() - cpu


def first_row_seconds(data: Path, model: str, work: Path, timeout: float) -> float:
    """Seconds from the start of a real `hsmon extract` to its first rows event."""
    events = work / "events.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO), "HSMON_CACHE": str(work / "cache")}  # no cached scan
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "hsmon", "extract", str(data), "--out", str(work / "out"),
                             "--model", model, "--events", str(events)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while time.perf_counter() - started < timeout:
            if events.exists() and any(json.loads(line).get("kind") == "rows"
                                       for line in events.read_text().splitlines() if line.strip()):
                return time.perf_counter() - started
            if proc.poll() is not None:
                raise RuntimeError(f"hsmon extract ended ({proc.returncode}): {proc.stderr.read()[-2000:]}")
            time.sleep(0.2)
        raise RuntimeError(f"no row after {timeout:.0f} s")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--tokens", type=int, default=2100, help="tokens a row (about)")
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--compare-rows", type=int, default=500)
    parser.add_argument("--timeout", type=float, default=1800)
    args = parser.parse_args()
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    model_dir = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    load = os.getloadavg()[0]
    print(f"load average before: {load:.2f} on {os.cpu_count()} CPUs; model {model_dir}", flush=True)
    with tempfile.TemporaryDirectory(prefix="hsmon-start-") as tmp:
        work = Path(tmp)
        data = work / "data.jsonl"
        make_dataset(data, args.rows, args.tokens, tokenizer)
        limits = ds.Limits(vocab_size=len(tokenizer), max_length=1 << 20)
        head = work / "head.jsonl"
        with open(data) as src, open(head, "w") as dst:
            for _, line in zip(range(args.compare_rows), src, strict=False):
                dst.write(line)
        old, old_cpu = per_row_scan(head, tokenizer, limits, args.compare_rows)
        started, cpu = time.perf_counter(), time.process_time()
        scan = ds.scan(head, tokenizer, limits)
        new, new_cpu = time.perf_counter() - started, time.process_time() - cpu
        per_row = scan.tokens / max(1, len(scan.rows or ()))
        print(f"scan of {args.compare_rows} rows ({per_row:.0f} tokens a row): one by one {old:.2f} s "
              f"({old_cpu:.2f} s CPU), batched {new:.2f} s ({new_cpu:.2f} s CPU)", flush=True)
        first = first_row_seconds(data, str(model_dir), work, args.timeout)
    print(f"hsmon extract over {args.rows} rows: first row after {first:.1f} s (goal: <= 60 s)")
    print(f"RESULT rows={args.rows} model={args.model} tokens_per_row={per_row:.0f} first_row_s={first:.1f} "
          f"scan_old_s={old:.2f} scan_new_s={new:.2f} scan_speedup={old / new:.2f} "
          f"scan_old_cpu_s={old_cpu:.2f} scan_new_cpu_s={new_cpu:.2f} "
          f"extrapolated_scan_300k_cpu_s={new_cpu / args.compare_rows * 300_000:.0f} "
          f"load={load:.2f} load_after={os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

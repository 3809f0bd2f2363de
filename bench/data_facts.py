"""Benchmark: the daemon's extra cost for data facts (hsmon/contracts/data_facts.py) per manifest row.

Feeds ``--rows`` row records shaped like `hsmon extract`'s (4 layers of 7 figures; a chunk record
every ``--chunk-size`` rows) to the output tracker's two paths: parsing alone (json.loads, what
the tracker already does for every record: the baseline) and parsing plus ``DataFacts.add``; plus
``snapshot()`` and ``summarize()``, which the daemon runs once per scan. Printed: microseconds
per row for each, the extra per row, the share of one core that the extra costs at the original job's
rate (2 rows/s, one scan per second; goal <= 0.1 %), and the accumulator's size after 10 chunks and
after all rows (goal: flat).

    python bench/data_facts.py [--rows 1000000] [--chunk-size 2000]
    python bench/data_facts.py --variation OUT   # a real output's chunk-to-chunk variation instead:
        per layer, the largest distance of a chunk's mean L2 norm / std from the first 3 chunks'
        (what the 25 % drift tolerance is set against); ends RESULT variation_worst=... chunks=...
Ends with: RESULT rows=... parse_us_per_row=... facts_us_per_row=... extra_ratio=...
           core_share_at_2_rows_s=... snapshot_us=... size_flat=...
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hsmon.contracts.data_facts import REFERENCE_CHUNKS, DataFacts, chunk_variation, summarize
from hsmon.contracts.layout import MANIFEST_NAME, iter_jsonl

LAYERS = ("final", "2", "16", "29")


def record_lines(rows: int, chunk_size: int) -> list[bytes]:
    rng = random.Random(0)
    lines = []
    for row in range(rows):
        tokens = rng.randint(200, 2000)
        stats = {layer: [tokens, tokens * rng.uniform(40, 60), tokens * 4096, rng.uniform(-5, 5),
                         tokens * 4096 * rng.uniform(0.8, 1.2), rng.uniform(10, 90), 0] for layer in LAYERS}
        start = row // chunk_size * chunk_size
        chunk = f"rows_{start}-{start + chunk_size}"
        lines.append(json.dumps({"type": "row", "row": row, "chunk": chunk, "tokens": tokens,
                                 "bytes": tokens * 4096 * 8, "sha256": "0" * 64, "stats": stats}).encode())
        if (row + 1) % chunk_size == 0:
            finished = {layer: {"mean_l2": rng.uniform(49, 51), "std": rng.uniform(0.98, 1.02),
                                "max_abs": 90.0, "nonfinite": 0} for layer in LAYERS}
            lines.append(json.dumps({"type": "chunk", "chunk": chunk, "rows": chunk_size,
                                     "stats": finished}).encode())
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--chunk-size", type=int, default=2000)
    parser.add_argument("--variation", metavar="OUT", help="measure a real output's chunk variation instead")
    args = parser.parse_args()
    if args.variation:
        return variation(Path(args.variation))
    lines = record_lines(args.rows, args.chunk_size)

    start = time.process_time()
    for raw in lines:
        json.loads(raw)
    parse_s = time.process_time() - start

    facts = DataFacts()
    size_early = None
    early = min(len(lines) - 1, 10 * (args.chunk_size + 1))  # after 10 chunks: reference complete
    start = time.process_time()
    for i, raw in enumerate(lines):
        facts.add(json.loads(raw))
        if i == early:
            size_early = len(json.dumps(facts.snapshot()))
    both_s = time.process_time() - start
    size_end = len(json.dumps(facts.snapshot()))

    start = time.process_time()
    scans = 2000
    for _ in range(scans):
        facts.snapshot()
        summarize(facts)
    snapshot_us = (time.process_time() - start) / scans * 1e6

    parse_us = parse_s / args.rows * 1e6
    facts_us = both_s / args.rows * 1e6
    extra_us = max(facts_us - parse_us, 0.0)
    share = (extra_us * 2 + snapshot_us * 1) / 1e6  # 2 rows/s and one scan per second
    print(f"rows {args.rows}, {len(LAYERS)} layers, chunks of {args.chunk_size}")
    print(f"parse only (baseline): {parse_us:.2f} us/row; parse + DataFacts.add: {facts_us:.2f} us/row "
          f"(extra {extra_us:.2f} us/row, ratio {facts_us / parse_us:.2f})")
    print(f"snapshot + summarize per scan: {snapshot_us:.1f} us")
    print(f"extra share of one core at 2 rows/s and 1 scan/s: {share * 100:.4f} % (goal <= 0.1 %)")
    print(f"snapshot size after 10 chunks {size_early} B, after {args.rows}: {size_end} B")
    print(f"RESULT rows={args.rows} parse_us_per_row={parse_us:.2f} facts_us_per_row={facts_us:.2f} "
          f"extra_ratio={facts_us / parse_us:.2f} core_share_at_2_rows_s={share:.6f} "
          f"snapshot_us={snapshot_us:.1f} size_flat={size_end <= (size_early or 0) + 200}")
    return 0


def variation(out: Path) -> int:
    """Print the chunk-to-chunk variation of a real output (hsmon layout)."""
    records = list(iter_jsonl(out / MANIFEST_NAME))
    chunks = sum(r.get("type") == "chunk" for r in records)
    worst = chunk_variation(records)
    print(f"{out}: {chunks} chunks, the first {REFERENCE_CHUNKS} the reference")
    for layer, figures in worst.items():
        said = ", ".join(f"{name} within {value * 100:.1f} %" for name, value in figures.items())
        print(f"layer {layer:>6}: {said} of the reference")
    top = max((f for figures in worst.values() for f in figures.values()), default=0.0)
    print(f"RESULT variation_worst={top:.4f} chunks={chunks} tolerance=0.25")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

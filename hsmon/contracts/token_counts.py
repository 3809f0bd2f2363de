"""The spool contract (the online spool), the extractor's part: the dataset's token counts, before any row.

    OUT/hsmon-token-counts.json                  unsharded
    OUT/hsmon-token-counts.shard-I-of-N.json     per shard

    {"dataset_sha256": "...", "rows_sampled": n, "rows_valid": m, "ts": ts,
     "counts": {"token id": count, ...}}

``counts`` are the loss-masked target tokens (``input_ids[1:]`` where ``loss_mask[1:]``) of up to
SAMPLE_ROWS valid rows spread evenly over the shard's rows, tokenized exactly as the rows' files
will hold them: what the offline trainer counts over the finished data (trainer/data.py
build_index) known before the first hidden state. A following trainer (`hsmon train --follow`)
takes its draft vocabulary from these instead of from the few chunks on hand at its start, which
miss a share of the data's tokens (a drafter cannot propose a token outside its vocabulary).
Written atomically; a resumed extraction over the same dataset keeps the file.

No heavy imports here: the trainer and the monitor import this module.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from hsmon.contracts import layout

SAMPLE_ROWS = 4000  # rows counted at most per shard (the offline trainer's VOCAB_SAMPLE_ROWS)
PREFIX = "hsmon-token-counts"


def token_counts_name(shard: tuple[int, int] | None = None) -> str:
    if shard is None or shard[1] == 1:
        return f"{PREFIX}.json"
    return f"{PREFIX}.shard-{shard[0]}-of-{shard[1]}.json"


@dataclass(frozen=True)
class TokenCounts:
    """Every shard's counts on hand, summed."""

    counts: Counter
    rows_sampled: int
    files: int
    dataset_sha256: str | None = None


def write_token_counts(out_dir: str | os.PathLike[str], shard: tuple[int, int] | None, counts: Counter,
                       rows_sampled: int, rows_valid: int, dataset_sha256: str) -> Path:
    """Write one shard's counts (atomic); returns the file's path."""
    path = Path(out_dir) / token_counts_name(shard)
    payload = json.dumps({
        "dataset_sha256": dataset_sha256, "rows_sampled": rows_sampled, "rows_valid": rows_valid,
        "ts": time.time(), "counts": {str(k): int(v) for k, v in sorted(counts.items())},
    }).encode()
    layout.atomic_write(path, lambda fh: fh.write(payload))
    return path


def read_header(path: Path) -> dict[str, object] | None:
    """A counts file's fields but ``counts`` (None when it is missing or unreadable)."""
    try:
        payload = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("counts"), dict):
        return None
    return {k: v for k, v in payload.items() if k != "counts"}


def read_token_counts(out_dir: str | os.PathLike[str]) -> TokenCounts | None:
    """The summed counts of every shard's file in ``out_dir``, or None when there is none
    (an extractor from before this contract, or one that has not finished its scan)."""
    total: Counter = Counter()
    sampled = files = 0
    sha: str | None = None
    for path in sorted(Path(out_dir).glob(f"{PREFIX}*.json")):
        try:
            payload = json.loads(path.read_bytes())
            counts = {int(k): int(v) for k, v in payload["counts"].items()}
            rows = int(payload.get("rows_sampled") or 0)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # unreadable: the trainer falls back to its set-up sample
        total.update(counts)
        sampled += rows
        files += 1
        sha = payload.get("dataset_sha256") if isinstance(payload.get("dataset_sha256"), str) else sha
    if not files:
        return None
    return TokenCounts(total, sampled, files, sha)

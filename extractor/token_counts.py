"""The dataset's token counts for a following trainer's draft vocabulary (hsmon.contracts.token_counts).

Counted once per dataset, before the first row is computed, from up to SAMPLE_ROWS of the shard's
valid rows spread evenly (as the offline trainer samples the finished data), tokenized as the
row files will hold them. A resumed extraction over the same dataset keeps the file it wrote.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from extractor import dataset as ds
from hsmon.contracts import token_counts as tc


def spread(rows: Sequence[int], limit: int) -> list[int]:
    """At most ``limit`` of ``rows``, evenly spaced from the first (all of them when fewer)."""
    step = max(1, -(-len(rows) // max(1, limit)))
    return list(rows[::step])


def count_tokens(rows: Any) -> tuple[Counter, int]:
    """(the loss-masked target tokens' counts, rows counted) of tokenized rows (``ds.Row``)."""
    counts: Counter = Counter()
    counted = 0
    for row in rows:
        counts.update(t for t, m in zip(row.input_ids[1:], row.loss_mask[1:], strict=True) if m)
        counted += 1
    return counts, counted


def write_scan_counts(data: Path, out: Path, shard: tuple[int, int] | None, scan: ds.ScanResult,
                      tokenizer: Any, limits: ds.Limits) -> Path | None:
    """Write the shard's counts file unless one for this dataset is there already; returns its
    path when written."""
    path = out / tc.token_counts_name(shard)
    header = tc.read_header(path)
    if header is not None and header.get("dataset_sha256") == scan.sha256:
        return None
    valid = list(scan.rows or ())
    wanted = set(spread(valid, tc.SAMPLE_ROWS))
    counts, counted = count_tokens(ds.iter_rows(data, tokenizer, limits, wanted))
    return tc.write_token_counts(out, shard, counts, counted, len(valid), scan.sha256)

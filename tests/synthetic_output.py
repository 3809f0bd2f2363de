"""A synthetic `hsmon extract` output directory of any size, written by the project's own layout
functions (``layout.append_jsonl``, ``extractor.writer.ChunkBook`` for the chunk records), with no
row files: the shape a monitor or a resume meets at scale (used by tests and bench/scale.py).

Each row record carries ``stats`` for 4 layers (``final`` and 3 capture points) as the writer's
are; every ``reject_every``-th row is rejected instead (a ``reject`` record and rejects.jsonl).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsmon.contracts import layout

LAYERS = ("final", "2", "4", "6")


@dataclass
class Written:
    """What a synthetic directory holds, summed as it was written."""

    rows: set[int]
    rejects: set[int]
    tokens: int = 0
    bytes: int = 0
    chunks: int = 0


def row_record(row: int, chunk_size: int, rng: random.Random, tokens: int | None = None) -> dict[str, Any]:
    """A ``row`` record shaped like RowWriter's (random but plausible figures)."""
    n = tokens if tokens is not None else rng.randint(200, 4000)
    stats = {layer: [n, rng.random() * 1e5, n * 576, rng.uniform(-50, 50), rng.random() * 1e6,
                     rng.random() * 30, 0] for layer in LAYERS}
    return {"type": "row", "row": row, "chunk": layout.chunk_dir_name(*layout.chunk_bounds(row, chunk_size)),
            "tokens": n, "bytes": n * 4 * 576 * 4 + 1500,
            "sha256": hashlib.sha256(row.to_bytes(8, "little")).hexdigest(), "stats": stats}


def run_record(rows_total: int, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "run", "settings": settings or {"chunk_size": layout.DEFAULT_CHUNK_SIZE},
            "pid": 1, "started": 1.0e9, "rows_done": 0, "tokens_done": 0, "rows_total": rows_total,
            "tokens_total": None, "chunks_total": None, "rejects": 0, "bytes_needed": 0}


def write_synthetic_output(out: Path, rows: int, *, chunk_size: int = layout.DEFAULT_CHUNK_SIZE,
                           reject_every: int = 0, done: Any = None, seed: int = 0,
                           settings: dict[str, Any] | None = None, lengths: Any = None) -> Written:
    """Write the manifest of an extraction of ``rows`` rows into ``out`` (rows in ``done``, a
    container, or all); a chunk record follows each chunk whose rows are all done or rejected.
    ``lengths[i]``: row i's tokens (random when None). Returns what was written."""
    from extractor.writer import ChunkBook

    out.mkdir(parents=True, exist_ok=True)
    manifest = out / layout.MANIFEST_NAME
    rng = random.Random(seed)
    rejected = {i for i in range(rows) if reject_every and i % reject_every == reject_every - 1}
    expected: dict[int, int] = {}
    for i in range(rows):
        start = layout.chunk_bounds(i, chunk_size)[0]
        expected[start] = expected.get(start, 0) + 1
    book = ChunkBook(chunk_size, expected)
    written = Written(set(), set())
    layout.append_jsonl(manifest, [run_record(rows, settings)])
    for start in range(0, rows, chunk_size):
        batch = []
        for i in range(start, min(start + chunk_size, rows)):
            if i in rejected:
                batch.append({"type": "reject", "row": i, "reason": "too long: synthetic"})
                book.add_reject(i)
                written.rejects.add(i)
            elif done is None or i in done:
                record = row_record(i, chunk_size, rng, None if lengths is None else int(lengths[i]))
                batch.append(record)
                book.add_row(record)
                written.rows.add(i)
                written.tokens += record["tokens"]
                written.bytes += record["bytes"]
        chunks = book.completed()
        written.chunks += len(chunks)
        layout.append_jsonl(manifest, batch + chunks, fsync=False)
    if rejected:
        lines = [{"row": i, "line": i + 1, "reason": "too long: synthetic"} for i in sorted(rejected)]
        layout.append_jsonl(out / layout.REJECTS_NAME, lines)
    return written


def scratch_totals(out: Path) -> dict[str, Any]:
    """The figures of ``out``'s manifests summed from scratch with the standard library's json,
    as the readers before running totals did (complete lines only; a row counted once)."""
    rows: dict[int, dict[str, Any]] = {}
    rejects: set[int] = set()
    chunks: set[str] = set()
    for path in layout.manifest_paths(out):
        for record in _complete_lines(path):
            kind = record.get("type")
            if kind == "row":
                rows.setdefault(record["row"], record)
            elif kind == "reject":
                rejects.add(record["row"])
            elif kind == "chunk":
                chunks.add(record["chunk"])
    return {"rows": len(rows), "tokens": sum(r["tokens"] for r in rows.values()),
            "bytes": sum(r["bytes"] for r in rows.values()), "rejects": len(rejects),
            "chunks_complete": len(chunks), "row_ids": set(rows)}


def _complete_lines(path: Path) -> Iterator[dict[str, Any]]:
    import json

    for raw in path.read_bytes().split(b"\n")[:-1]:
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if isinstance(record, dict):
            yield record

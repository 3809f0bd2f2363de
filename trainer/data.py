"""Training data over the extraction layout (the layout contract), streamed with bounded memory.

Only an index of (file, row, length) stays in memory; row files are read batch by batch in a
background thread with a bounded queue. Each epoch's batch plan is a pure function of
(seed, epoch), so the data position of a resumed run is just (epoch, batch index).
"""

from __future__ import annotations

import json
import os
import queue
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hsmon.contracts.heldout import is_held_out
from hsmon.contracts.layout import (
    MANIFEST_GLOB,
    atomic_write,
    manifest_chunk_error,
    manifest_paths,
    parse_row_file_name,
    row_file_name,
)
from hsmon.contracts.manifest_reader import complete_row_files, iter_records
from trainer.nonfinite import row_stats_nonfinite, tensors_finite

# The draft vocabulary, when --draft-vocab-size is not given: the most frequent trained tokens that
# cover DRAFT_VOCAB_COVERAGE of the trained tokens, rounded up to a multiple of 64, at least
# DRAFT_VOCAB_MIN and at most DEFAULT_DRAFT_VOCAB (or the target's vocabulary when smaller).
# A smaller head learns faster on little data (docs/benchmarks.md, "Defaults").
DEFAULT_DRAFT_VOCAB = 32000
DRAFT_VOCAB_COVERAGE = 0.99
DRAFT_VOCAB_MIN = 256
INDEX_NAME = "data-index.json"
# Rows read for the draft vocabulary's token counts (and the shapes) when a manifest lists the rows.
VOCAB_SAMPLE_ROWS = 4000


class DataError(ValueError):
    """Unusable training data; the message names the input and the fix."""


def check_chunk_name(record: dict[str, Any], manifest: str) -> None:
    """DataError naming the manifest and its line when a record's chunk is not a plain chunk
    directory of the layout (``../x`` would send reads, and --consume's deletes, outside)."""
    error = manifest_chunk_error(record)
    if error:
        raise DataError(f"{manifest}: {error} in the line {json.dumps(record)[:200]}; refused: a manifest "
                        "written by hsmon extract names only its own chunk directories (was it edited?)")


@dataclass(frozen=True)
class RowRef:
    path: str
    row: int
    length: int


@dataclass
class Batch:
    """A padded batch. Step-0 position t reads ``aux[:, t]`` and ``next_ids[:, t]`` and is scored
    against ``target_hidden[:, t]`` where ``loss_mask[:, t]``; later TTT steps shift the ids, the
    targets and the mask left (the tails are padding with mask 0)."""

    aux: torch.Tensor           # [B, T, K*H]
    next_ids: torch.Tensor      # [B, T] token after each position
    target_hidden: torch.Tensor  # [B, T, H] target's last hidden state at the next position
    loss_mask: torch.Tensor     # [B, T] 1 where the next token is trained on
    rows: list[int]
    real_tokens: int  # positions that are not padding


def load_row(path: str | Path) -> dict[str, torch.Tensor]:
    """One row file; raises DataError naming the file when it lacks a field."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:
        raise DataError(f"{path}: cannot read row file ({exc}); re-extract it or delete it") from exc
    missing = [k for k in ("input_ids", "loss_mask", "hidden_state", "aux_hidden_state") if k not in data]
    if missing:
        raise DataError(f"{path}: row file lacks {', '.join(missing)}; it is not EAGLE-3 training data")
    return data


@dataclass
class DataIndex:
    """Every usable row's file and length, the draft-vocabulary counts, and the data's shapes."""

    rows: list[RowRef]
    token_counts: Counter
    hidden_size: int
    aux_size: int
    nonfinite_rows: list[int] = field(default_factory=list)  # left out: they hold NaN/Inf

    @property
    def num_aux(self) -> int:
        return self.aux_size // self.hidden_size

    def split(self, eval_fraction: float) -> tuple[list[RowRef], list[RowRef]]:
        """(train, held-out). With at least 2 rows both sides are non-empty."""
        held = [r for r in self.rows if is_held_out(r.row, eval_fraction)] if eval_fraction > 0 else []
        train = [r for r in self.rows if not (eval_fraction > 0 and is_held_out(r.row, eval_fraction))]
        if eval_fraction > 0 and not held and len(train) >= 2:
            held, train = train[-1:], train[:-1]
        if not train and len(held) >= 2:
            train, held = held[:-1], held[-1:]
        return train, held


def build_index(data_dir: str | Path, max_length: int | None = None) -> DataIndex:
    """Index the complete rows of ``data_dir``.

    With a manifest, rows and lengths come from its row records and the files are listed, not
    read (a 300k-row directory indexes in seconds); the shapes and the draft-vocabulary counts come
    from VOCAB_SAMPLE_ROWS rows spread evenly over the data (all of them when there are fewer).
    Without one (a SpecForge layout written by another tool), every row file is read (only its
    input_ids and loss_mask pages). Rows with NaN/Inf are left out and listed in ``nonfinite_rows``:
    from the manifest's per-row stats, or, for rows without stats, by checking their hidden
    states once here."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise DataError(f"{data_dir}: not a directory; pass the output directory of `hsmon extract`")
    listed = manifest_rows(data_dir, max_length)
    nonfinite: list[int] = []
    if listed is not None:
        rows, nonfinite, unchecked = listed
        if unchecked:
            bad = {r.row for r in rows if r.row in unchecked and not tensors_finite(load_row(r.path))}
            rows = [r for r in rows if r.row not in bad]
            nonfinite = sorted(set(nonfinite) | bad)
    else:
        rows = [RowRef(str(p), parse_row_file_name(p.name) or 0, 0)
                for p in complete_row_files(data_dir) if p.is_file()]
    step = max(1, -(-len(rows) // VOCAB_SAMPLE_ROWS)) if listed is not None else 1
    counts: Counter = Counter()
    hidden_size = aux_size = 0
    kept: list[RowRef] = []
    for ref in rows[::step]:
        data = load_row(ref.path)
        if listed is None and not tensors_finite(data):
            nonfinite.append(ref.row)
            continue
        ids = data["input_ids"].reshape(-1)
        mask = data["loss_mask"].reshape(-1)
        length = int(ids.shape[0]) if max_length is None else min(int(ids.shape[0]), max_length)
        if length < 2:
            continue
        h = int(data["hidden_state"].shape[-1])
        a = int(data["aux_hidden_state"].shape[-1])
        if hidden_size == 0:
            hidden_size, aux_size = h, a
        elif (h, a) != (hidden_size, aux_size):
            raise DataError(f"{ref.path}: hidden sizes {h}/{a} differ from the other rows' "
                            f"{hidden_size}/{aux_size}; the directory mixes two targets")
        counts.update(ids[1:length][mask[1:length].bool()].tolist())
        kept.append(RowRef(ref.path, ref.row, length))
    if listed is None:
        rows = kept
    if not rows or not hidden_size:
        bad = f" ({len(nonfinite)} rows hold NaN/Inf)" if nonfinite else ""
        raise DataError(f"{data_dir}: no complete rows with at least 2 tokens{bad}; run `hsmon extract` "
                        "into it first (or wait for its first chunk)")
    return DataIndex(rows, counts, hidden_size, aux_size, nonfinite)


def manifest_rows(data_dir: Path, max_length: int | None
                  ) -> tuple[list[RowRef], list[int], set[int]] | None:
    """(rows, nonfinite, unchecked): the rows the manifests count (with at least 2 tokens) whose
    file is there, from their row records and one listing per chunk directory, less those whose
    stats count NaN/Inf (``nonfinite``); ``unchecked``: rows whose record has no stats. None when
    the directory has no manifest."""
    if not manifest_paths(data_dir):
        return None
    listings: dict[str, set[str]] = {}
    rows: dict[int, RowRef] = {}
    nonfinite: set[int] = set()
    unchecked: set[int] = set()
    base = str(data_dir) + os.sep
    for record in iter_records(data_dir):
        check_chunk_name(record, f"{data_dir}/{MANIFEST_GLOB}")
        row, chunk, tokens = record.get("row"), record.get("chunk"), record.get("tokens")
        if record.get("type") != "row" or not isinstance(row, int) or not isinstance(chunk, str):
            continue
        if row in rows or row in nonfinite:
            continue
        if chunk not in listings:
            try:
                listings[chunk] = set(os.listdir(data_dir / chunk))
            except OSError:
                listings[chunk] = set()
        name = row_file_name(row)
        length = int(tokens or 0) if max_length is None else min(int(tokens or 0), max_length)
        if name not in listings[chunk] or length < 2:  # listed in the manifest but gone: skipped
            continue
        bad = row_stats_nonfinite(record.get("stats"))
        if bad:
            nonfinite.add(row)
            continue
        if bad is None:
            unchecked.add(row)
        rows[row] = RowRef(base + chunk + os.sep + name, row, length)
    return [rows[r] for r in sorted(rows)], sorted(nonfinite), unchecked


def save_index(index: DataIndex, path: Path) -> None:
    payload = {"rows": [[r.path, r.row, r.length] for r in index.rows],
               "token_counts": {str(k): v for k, v in index.token_counts.items()},
               "hidden_size": index.hidden_size, "aux_size": index.aux_size,
               "nonfinite_rows": index.nonfinite_rows}
    atomic_write(path, lambda fh: fh.write(json.dumps(payload).encode()))  # no link followed


def load_index(path: Path) -> DataIndex:
    payload = json.loads(path.read_text())
    return DataIndex([RowRef(p, r, n) for p, r, n in payload["rows"]],
                     Counter({int(k): v for k, v in payload["token_counts"].items()}),
                     payload["hidden_size"], payload["aux_size"], payload.get("nonfinite_rows", []))


def draft_vocab_for(counts: Counter, vocab_size: int) -> int:
    """The default draft vocabulary size: the most frequent tokens that cover 99 % of the trained
    tokens, rounded up to a multiple of 64, between 256 and 32,000 (never above ``vocab_size``)."""
    cap = min(DEFAULT_DRAFT_VOCAB, vocab_size)
    total = sum(n for tok, n in counts.items() if 0 <= tok < vocab_size)
    if total <= 0:
        return cap
    covered, needed = 0, 0
    for n in sorted((n for tok, n in counts.items() if 0 <= tok < vocab_size), reverse=True):
        covered += n
        needed += 1
        if covered >= DRAFT_VOCAB_COVERAGE * total:
            break
    return min(cap, max(DRAFT_VOCAB_MIN, -(-needed // 64) * 64))


def build_draft_vocab(counts: Counter, vocab_size: int, draft_vocab_size: int | None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d) from the frequency of loss-masked tokens.

    The draft vocabulary holds the ``draft_vocab_size`` most frequent trained tokens (default:
    `draft_vocab_for` the counts), topped up with the lowest unused ids, sorted by target id.
    ``d2t[i]`` is the offset from draft id i to its target id (SGLang and SpecForge convention),
    ``t2d`` a bool mask over the target vocabulary.
    """
    size = min(draft_vocab_size or draft_vocab_for(counts, vocab_size), vocab_size)
    chosen = [tok for tok, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
              if 0 <= tok < vocab_size][:size]
    if len(chosen) < size:
        taken = set(chosen)
        chosen += [t for t in range(vocab_size) if t not in taken][: size - len(chosen)]
    ids = torch.tensor(sorted(chosen), dtype=torch.int64)
    d2t = ids - torch.arange(size, dtype=torch.int64)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return d2t, t2d


def plan_epoch(rows: Sequence[RowRef], batch_tokens: int, seed: int, epoch: int,
               window: int = 512) -> list[list[int]]:
    """Batches (lists of indices into ``rows``) for one epoch.

    Rows are shuffled, then sorted by length within windows of ``window`` rows so that a batch
    holds similar lengths (little padding); a batch is as many rows as fit in ``batch_tokens``
    padded tokens (always at least one row). Batch order is shuffled again.
    """
    rng = random.Random(seed * 1_000_003 + epoch)
    order = list(range(len(rows)))
    rng.shuffle(order)
    batches: list[list[int]] = []
    for start in range(0, len(order), window):
        group = sorted(order[start:start + window], key=lambda i: rows[i].length)
        current: list[int] = []
        longest = 0
        for i in group:
            longest_if = max(longest, rows[i].length)
            if current and longest_if * (len(current) + 1) > batch_tokens:
                batches.append(current)
                current, longest_if = [], rows[i].length
            current.append(i)
            longest = longest_if
        if current:
            batches.append(current)
    rng.shuffle(batches)
    return batches


def collate(refs: Sequence[RowRef]) -> Batch:
    """Read and pad rows into a Batch (step-0 alignment, see Batch)."""
    items = []
    for ref in refs:
        data = load_row(ref.path)
        n = ref.length
        ids = data["input_ids"].reshape(-1)[:n].long()
        items.append((
            data["aux_hidden_state"].reshape(-1, data["aux_hidden_state"].shape[-1])[: n - 1],
            ids[1:n],
            data["hidden_state"].reshape(-1, data["hidden_state"].shape[-1])[1:n],
            data["loss_mask"].reshape(-1)[1:n],
        ))
    seq = max(it[1].shape[0] for it in items)
    bsz = len(items)
    aux = torch.zeros(bsz, seq, items[0][0].shape[-1], dtype=torch.float32)
    hid = torch.zeros(bsz, seq, items[0][2].shape[-1], dtype=torch.float32)
    nxt = torch.zeros(bsz, seq, dtype=torch.long)
    mask = torch.zeros(bsz, seq, dtype=torch.float32)
    for b, (a, i, h, m) in enumerate(items):
        n = i.shape[0]
        aux[b, :n] = a.float()
        nxt[b, :n] = i
        hid[b, :n] = h.float()
        mask[b, :n] = m.float()
    return Batch(aux, nxt, hid, mask, [r.row for r in refs], sum(it[1].shape[0] for it in items))


class Prefetcher:
    """Reads batches in a background thread, at most ``depth`` ahead (bounded memory).

    Records how long the consumer waited for each batch (``wait_seconds``).
    """

    def __init__(self, batches: Sequence[Sequence[RowRef]], depth: int = 4) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._batches = batches
        self.wait_seconds = 0.0
        self._thread = threading.Thread(target=self._work, name="hsmon-prefetch", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        for refs in self._batches:
            if self._stop.is_set():
                return
            try:
                item: Any = collate(refs)
            except Exception as exc:  # handed to the consumer, raised there
                item = exc
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(item, Exception):
                return
        self._queue.put(None)

    def __iter__(self) -> Iterator[Batch]:
        while True:
            start = time.perf_counter()
            item = self._queue.get()
            self.wait_seconds += time.perf_counter() - start
            if item is None:
                return
            if isinstance(item, Exception):
                raise item
            yield item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

"""Pure planning: which rows a shard owns, how rows are batched, how many bytes they need.

Batches never cross a chunk boundary and depend only on the row lengths, the chunk size and
the token budget. So a resumed run, a sharded run and an uninterrupted run put every row in
the same batch, and get bit-identical hidden states for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hsmon.contracts.capture_points import parse_capture_points

# torch.save's zip container adds about this much per file (measured: 2.3 kB for 4 tensors).
FILE_OVERHEAD_BYTES = 3000


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (0-based): it owns every chunk c with c % count == index."""

    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str | None) -> Shard:
        """'I/N' with 0 <= I < N; None -> the whole dataset."""
        if not text:
            return cls()
        try:
            index_text, count_text = text.split("/")
            index, count = int(index_text), int(count_text)
        except ValueError:
            raise ValueError(f"--shard {text!r}: use I/N, e.g. 0/4 for the first of four shards") from None
        if count < 1 or not 0 <= index < count:
            raise ValueError(f"--shard {text!r}: need 0 <= I < N (shards are numbered from 0)")
        return cls(index, count)

    def owns_chunk(self, chunk_index: int) -> bool:
        return chunk_index % self.count == self.index

    def owns_row(self, row: int, chunk_size: int) -> bool:
        return self.owns_chunk(row // chunk_size)

    @property
    def as_tuple(self) -> tuple[int, int] | None:
        return None if self.count == 1 else (self.index, self.count)


def plan_batches(rows: Sequence[int], lengths: Sequence[int], chunk_size: int,
                 batch_tokens: int) -> list[list[int]]:
    """Group consecutive rows into batches of padded size (rows x longest) <= batch_tokens.

    Returns lists of positions into ``rows``. A row longer than the budget goes alone; a batch
    never spans two chunks.
    """
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    chunk = -1
    for pos, (row, length) in enumerate(zip(rows, lengths, strict=True)):
        row_chunk = row // chunk_size
        new_longest = max(longest, length)
        if current and (row_chunk != chunk or new_longest * (len(current) + 1) > batch_tokens):
            batches.append(current)
            current, new_longest = [], length
        current.append(pos)
        longest, chunk = new_longest, row_chunk
    if current:
        batches.append(current)
    return batches


def row_bytes(tokens: int, hidden_size: int, captures: int, element_size: int) -> int:
    """Estimated size of one row file: ids and mask (int64) plus 1 + K hidden-state layers."""
    return tokens * 16 + tokens * hidden_size * (1 + captures) * element_size + FILE_OVERHEAD_BYTES


def parse_layers(text: str | None, num_layers: int) -> list[int]:
    """'--layers 2,4,5' -> [2, 4, 5], checked against an N-layer model; None -> the default."""
    return parse_capture_points(text, num_layers)

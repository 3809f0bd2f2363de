"""Reading the manifests (the layout contract, hsmon.contracts.layout) at a cost that does not grow
with their rows.

A manifest of a million rows is ~430 MB of JSON. Readers keep running totals (rows, tokens,
bytes; per chunk and in all), updated as records arrive, and per row only one bit (is it done,
is it rejected: :class:`RowSet`). Chunk records (a few hundred) are kept whole. Whoever needs a
row's full record (verify-data's sample, a resume's unfinished chunks) asks for it explicitly:
:func:`read_row_records` streams the file again, and ``Manifest(keep_open_rows=True)`` keeps the
records of chunks that have no chunk record yet (a resume's ChunkBook).

:class:`JsonlTail` reads an append-only file incrementally by byte offset, in 1 MiB blocks,
parsing with orjson; a partial last line waits for its end, a line cut by the writer's repair
(``layout.repair_jsonl_tail``) is read again from its start, a truncated or replaced file says
so (``reset``). An idle poll is one ``stat``.

Extension point: ``Manifest.accumulators`` receive every record once, in file order (a repeated
``row`` record of a row already counted is not passed on), e.g. per-chunk statistics.

No heavy imports here: the monitor imports this module.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson

from hsmon.contracts import layout
from hsmon.contracts.rejects import classify

BLOCK_BYTES = 1024 * 1024
# Row indices below this live in the bitmap (32 MiB at most); others, or negative ones, in a set.
BITMAP_ROWS = 1 << 28


def _row_index(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class RowSet:
    """A set of row indices at one bit per index (a growable bitmap); ``in``, ``add``, ``len``,
    ascending iteration. 1 M rows take 125 KB where a set of ints takes ~60 MB."""

    __slots__ = ("_bits", "_count", "_extra")

    def __init__(self, rows: Iterable[int] = ()) -> None:
        self._bits = bytearray()
        self._count = 0
        self._extra: set[int] = set()
        for row in rows:
            self.add(row)

    def add(self, row: int) -> bool:
        """Add ``row``; True when it was not there yet."""
        if not 0 <= row < BITMAP_ROWS:
            if row in self._extra:
                return False
            self._extra.add(row)
            self._count += 1
            return True
        byte, bit = row >> 3, 1 << (row & 7)
        if byte >= len(self._bits):
            self._bits.extend(bytes(max(byte + 1 - len(self._bits), len(self._bits) // 2)))
        if self._bits[byte] & bit:
            return False
        self._bits[byte] |= bit
        self._count += 1
        return True

    def __contains__(self, row: object) -> bool:
        if not isinstance(row, int):
            return False
        if not 0 <= row < BITMAP_ROWS:
            return row in self._extra
        byte = row >> 3
        return byte < len(self._bits) and bool(self._bits[byte] & (1 << (row & 7)))

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[int]:
        yield from sorted(r for r in self._extra if r < 0)
        for byte, value in enumerate(self._bits):
            if value:
                base = byte << 3
                for bit in range(8):
                    if value & (1 << bit):
                        yield base + bit
        yield from sorted(r for r in self._extra if r >= 0)

    def __repr__(self) -> str:
        return f"RowSet({self._count} rows)"


@dataclass
class ChunkTotals:
    """What the ``row`` records of one chunk add up to (the chunk record, when there is one, is
    in ``Manifest.chunks``)."""

    rows: int = 0
    tokens: int = 0
    bytes: int = 0


class Accumulator(Protocol):
    """Something that folds manifest records as they arrive (see ``Manifest.accumulators``)."""

    def add(self, record: dict[str, Any]) -> None: ...


@dataclass
class Manifest:
    """What the manifests of an output directory say is done, as running totals.

    ``rows``/``rejects``: which rows are done / rejected; ``reject_classes``: rejects by class.
    ``chunks``: chunk records by name.
    ``row_totals``: per chunk, the sums of its row records. ``runs``: the run records in order.
    A row recorded twice counts once (the first record). With ``keep_open_rows``, the full row
    records of chunks without a chunk record stay in ``open_rows`` (a resume needs them to write
    the chunk record); they are dropped once the chunk record arrives.
    """

    keep_open_rows: bool = False
    rows: RowSet = field(default_factory=RowSet)
    rejects: RowSet = field(default_factory=RowSet)
    reject_classes: dict[str, int] = field(default_factory=dict)
    chunks: dict[str, dict[str, Any]] = field(default_factory=dict)
    row_totals: dict[str, ChunkTotals] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)
    tokens: int = 0
    bytes: int = 0
    open_rows: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    accumulators: list[Accumulator] = field(default_factory=list)

    def handled(self, row: int) -> bool:
        """True when the row is done or rejected: a resumed run skips it."""
        return row in self.rows or row in self.rejects

    def add(self, record: dict[str, Any]) -> None:
        kind = record.get("type")
        if kind == "row":
            row = _row_index(record.get("row"))
            if row is None or not self.rows.add(row):
                return
            tokens, nbytes = _count(record.get("tokens")), _count(record.get("bytes"))
            self.tokens += tokens
            self.bytes += nbytes
            chunk = str(record.get("chunk", ""))
            totals = self.row_totals.get(chunk)
            if totals is None:
                totals = self.row_totals[chunk] = ChunkTotals()
            totals.rows += 1
            totals.tokens += tokens
            totals.bytes += nbytes
            if self.keep_open_rows and chunk not in self.chunks:
                self.open_rows.setdefault(chunk, []).append(record)
        elif kind == "reject":
            row = _row_index(record.get("row"))
            if row is None or not self.rejects.add(row):
                return
            kind_of = classify(str(record.get("reason", "")))
            self.reject_classes[kind_of] = self.reject_classes.get(kind_of, 0) + 1
        elif kind == "chunk" and isinstance(record.get("chunk"), str):
            self.chunks[record["chunk"]] = record
            self.open_rows.pop(record["chunk"], None)
        elif kind == "run":
            self.runs.append(record)
        for accumulator in self.accumulators:
            accumulator.add(record)

    def open_row_records(self) -> list[dict[str, Any]]:
        """Row records of chunks with no chunk record yet, in row order (needs ``keep_open_rows``)."""
        return sorted((r for rows in self.open_rows.values() for r in rows), key=lambda r: r["row"])


def _count(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def parse_lines(lines: list[bytes], handle: Callable[[dict[str, Any]], None]) -> int:
    """Feed each line that is a JSON object to ``handle``; bad lines are skipped. Returns the
    number of objects."""
    n = 0
    for raw in lines:
        if not raw:
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            handle(obj)
            n += 1
    return n


@dataclass
class JsonlTail:
    """Incremental reader of an append-only JSON Lines file (restarts on truncation/rotation)."""

    path: str
    offset: int = 0  # bytes consumed, the partial line included
    inode: int | None = None
    size: int = 0  # the file's size at the last poll
    _partial: bytes = b""

    def poll(self, handle: Callable[[dict[str, Any]], None], stop: Callable[[], bool] | None = None
             ) -> tuple[int, bool]:
        """Feed new complete records to ``handle``; returns (records, reset) where reset says the
        file was truncated or replaced (the caller drops what it built and reads it again:
        this tail starts over). ``stop()`` is asked between blocks."""
        try:
            st = os.stat(self.path)
        except OSError:
            return 0, False
        if self.inode is not None and st.st_ino != self.inode:
            return self._restart(st), True
        self.size = st.st_size
        if self._partial and not self._partial_intact(st.st_size):
            # the writer cut a partial line (a crash mid-append) and may have written on: read
            # again from where that line started
            self.offset -= len(self._partial)
            self._partial = b""
        if st.st_size < self.offset:
            return self._restart(st), True
        self.inode = st.st_ino
        if st.st_size == self.offset:
            return 0, False
        return self._read(st.st_size, handle, stop), False

    def _restart(self, st: os.stat_result) -> int:
        self.offset, self._partial, self.inode, self.size = 0, b"", st.st_ino, st.st_size
        return 0

    def _partial_intact(self, size: int) -> bool:
        start = self.offset - len(self._partial)
        if size < self.offset:
            return False
        try:
            with open(self.path, "rb") as fh:
                fh.seek(start)
                return fh.read(len(self._partial)) == self._partial
        except OSError:
            return False

    def _read(self, end: int, handle: Callable[[dict[str, Any]], None], stop: Callable[[], bool] | None
              ) -> int:
        n = 0
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                while self.offset < end and not (stop and stop()):
                    block = fh.read(min(BLOCK_BYTES, end - self.offset))
                    if not block:
                        break
                    self.offset += len(block)
                    lines = (self._partial + block).split(b"\n")
                    self._partial = lines.pop()  # what follows the last newline: a partial line
                    n += parse_lines(lines, handle)
        except OSError:
            pass
        return n


def read_manifest(out_dir: str | os.PathLike[str], name: str | None = None, keep_open_rows: bool = False,
                  accumulators: list[Accumulator] | None = None) -> Manifest:
    """Read one manifest (``name``) or all of them (every shard's) in ``out_dir``, streaming;
    ``accumulators`` see every record as it is folded."""
    manifest = Manifest(keep_open_rows=keep_open_rows, accumulators=list(accumulators or ()))
    paths = [Path(out_dir) / name] if name else layout.manifest_paths(out_dir)
    for path in paths:
        JsonlTail(str(path)).poll(manifest.add)
    return manifest


def iter_records(out_dir: str | os.PathLike[str], name: str | None = None) -> Iterator[dict[str, Any]]:
    """Every record of one manifest (``name``) or of all of them, streamed (complete lines only)."""
    paths = [Path(out_dir) / name] if name else layout.manifest_paths(out_dir)
    batch: list[dict[str, Any]] = []

    def one_block() -> bool:
        return bool(batch)

    for path in paths:
        tail = JsonlTail(str(path))
        while True:
            tail.poll(batch.append, stop=one_block)
            if not batch:
                break
            yield from batch
            batch.clear()


def read_row_records(out_dir: str | os.PathLike[str], rows: Iterable[int] | None = None,
                     name: str | None = None) -> dict[int, dict[str, Any]]:
    """Full ``row`` records by row (the first of each), of the rows asked for (all when None: for
    small outputs and tests only). Reads the manifests again rather than holding every record."""
    wanted = None if rows is None else set(rows)
    found: dict[int, dict[str, Any]] = {}
    for record in iter_records(out_dir, name):
        row = _row_index(record.get("row"))
        if (record.get("type") == "row" and row is not None and row not in found
                and (wanted is None or row in wanted)):
            found[row] = record
    return found


def complete_row_files(out_dir: str | os.PathLike[str]) -> list[Path]:
    """Row files a reader may use: those in the manifest when there is one, else every
    ``rows_*/data_*.ckpt`` (a plain SpecForge layout written by another tool)."""
    out = Path(out_dir)
    if layout.manifest_paths(out):
        chunks: dict[int, str] = {}
        for record in iter_records(out):
            row = _row_index(record.get("row"))
            if record.get("type") == "row" and row is not None and row not in chunks:
                chunks[row] = str(record.get("chunk", ""))
        return [out / chunk / layout.row_file_name(row) for row, chunk in sorted(chunks.items())]
    files = []
    for chunk in out.iterdir() if out.is_dir() else ():
        if chunk.is_dir() and layout.parse_chunk_dir_name(chunk.name):
            files += [f for f in chunk.iterdir() if layout.parse_row_file_name(f.name) is not None]
    return sorted(files, key=lambda f: layout.parse_row_file_name(f.name) or 0)

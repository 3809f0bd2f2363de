"""The layout contract: the output layout, shared by the extractor (writes), monitor and trainer (read).

    OUT/rows_{a}-{b}/data_{i}.ckpt     one torch.save dict per input row i, a <= i < b
    OUT/hsmon-manifest.jsonl           append-only, fsynced: what counts as done
    OUT/hsmon-manifest.shard-I-of-N.jsonl   the same, per shard, when --shard is used
    OUT/rejects.jsonl                  rejected input rows: {"row", "line", "reason", "class"}
    OUT/rejects.shard-I-of-N.jsonl     the same, per shard

Manifest records (one JSON object per line, ``type`` says which):
    {"type": "run", "settings": {...}, "pid": .., "started": ts, "rows_done": n, "tokens_done": n,
     "rows_total": n, "tokens_total": n, "chunks_total": n, "rejects": n, "bytes_needed": b,
     "captured": {"points": [p...], ...}}                   the points the engine really captures
                                                            (sglang: per server, its model class,
                                                            layer ids and captured_points)
                                                            once per (re)start of a run; the
                                                            ``*_total`` fields are the shard's
                                                            plan (what --dry-run computes)
    {"type": "done", "ts": ts, "rows": n, "tokens": n, "bytes": b, "chunks": n, "rejects": n,
     "rejects_by_reason": {class: n}, "seconds": s}         the run wrote every planned row
    {"type": "stopped", "ts": ts, "reason": "signal", "rows": n, ... as done}
                                                            the run stopped on request (SIGTERM)
    {"type": "row", "row": i, "chunk": "rows_a-b", "tokens": n, "bytes": b, "sha256": hex,
     "stats": {layer: [tokens, sum_l2, count, sum, sumsq, max_abs, nonfinite, first_tokens, first_l2]}}
    {"type": "reject", "row": i, "reason": "..."}           a dataset row, or one a backend could
                                                            not compute (hsmon.contracts.rejects classes)
    {"type": "chunk", "chunk": "rows_a-b", "rows": k, "tokens": n, "bytes": b, "sha256": hex,
     "rejects": r, "stats": {layer: {"mean_l2": .., "std": .., "max_abs": .., "nonfinite": ..,
                                     "mean_l2_rest": ..}}}      (mean_l2_rest: positions after the first)

``sha256`` of a row is that of its file's bytes; a chunk's is the sha256 of its rows' hex
digests concatenated in row order. Layers are named ``final`` (the hidden state after the
final norm) and by capture point (``"2"``, ``"16"``, ...). A row's raw sums (finite values
only; ``tokens``/``sum_l2`` over tokens whose whole vector is finite) let a chunk's statistics
be finished without reading files again. A chunk record is written once every row of the
chunk is done or rejected; ``rows_a-b`` is named by the chunk size, so the last chunk's ``b``
may lie past the dataset's end.

A ``done`` or ``stopped`` record ends the run whose ``run`` record comes last before it: a run
record after it (a resume) makes the manifest unfinished again. Manifests written before these
records existed have no plan and no ending; readers treat both as unknown.

Files are written under a hidden temporary name (``.data_i.ckpt.tmp-PID``), flushed, fsynced
and renamed; a row is done only once its ``row`` record is in the manifest. A trailing partial
line (a crash mid-append) is ignored by readers and cut by the next writer.

Reading the manifests (running totals, incremental tails): hsmon.contracts.manifest_reader.

No heavy imports here: the monitor imports this module.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from hsmon.contracts import nofollow

MANIFEST_NAME = "hsmon-manifest.jsonl"
MANIFEST_GLOB = "hsmon-manifest*.jsonl"
REJECTS_NAME = "rejects.jsonl"
REJECTS_GLOB = "rejects*.jsonl"
DEFAULT_CHUNK_SIZE = 2000
TMP_MARK = ".tmp-"

CHUNK_DIR_RE = re.compile(r"^rows_(\d+)-(\d+)$")
ROW_FILE_RE = re.compile(r"^data_(\d+)\.ckpt$")


def manifest_name(shard: tuple[int, int] | None = None) -> str:
    """File name of the manifest for a shard (index, count), or the unsharded one."""
    if shard is None or shard[1] == 1:
        return MANIFEST_NAME
    index, count = shard
    return f"hsmon-manifest.shard-{index}-of-{count}.jsonl"


def rejects_name(shard: tuple[int, int] | None = None) -> str:
    """File name of the rejects file for a shard (index, count), or the unsharded one."""
    if shard is None or shard[1] == 1:
        return REJECTS_NAME
    index, count = shard
    return f"rejects.shard-{index}-of-{count}.jsonl"


def chunk_bounds(row: int, chunk_size: int = DEFAULT_CHUNK_SIZE) -> tuple[int, int]:
    """(a, b) of the chunk that holds ``row``."""
    start = (row // chunk_size) * chunk_size
    return start, start + chunk_size


def chunk_dir_name(start: int, end: int) -> str:
    return f"rows_{start}-{end}"


def row_file_name(row: int) -> str:
    return f"data_{row}.ckpt"


def row_path(out_dir: str | os.PathLike[str], row: int, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Path:
    """Where row ``row`` lives in the layout."""
    return Path(out_dir) / chunk_dir_name(*chunk_bounds(row, chunk_size)) / row_file_name(row)


def parse_chunk_dir_name(name: str) -> tuple[int, int] | None:
    match = CHUNK_DIR_RE.match(name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def manifest_chunk_error(record: dict[str, Any]) -> str | None:
    """Why a manifest record's ``chunk`` is not a plain chunk directory of this layout
    (``rows_A-B``, the record's row within [A, B)): a name such as ``../x`` would lead a reader,
    and a consuming trainer's deletes, out of the output directory. None when it is plain (or
    the record names no chunk)."""
    chunk = record.get("chunk")
    if chunk is None:
        return None
    match = CHUNK_DIR_RE.fullmatch(chunk) if isinstance(chunk, str) else None
    if match is None:
        return f"chunk {chunk!r} is not a chunk directory of the layout (rows_A-B)"
    row = record.get("row")
    if isinstance(row, int) and not int(match.group(1)) <= row < int(match.group(2)):
        return f"row {row} does not belong in chunk {chunk}"
    return None


def parse_row_file_name(name: str) -> int | None:
    match = ROW_FILE_RE.match(name)
    return int(match.group(1)) if match else None


def is_temporary(name: str) -> bool:
    """True for a file still being written (hidden temporary name)."""
    return name.startswith(".") and TMP_MARK in name


def temporary_path(final: Path) -> Path:
    return final.with_name(f".{final.name}{TMP_MARK}{os.getpid()}")


def atomic_write(final: str | os.PathLike[str], write: Callable[[IO[bytes]], None]) -> int:
    """Write a file through ``write(fh)`` under a temporary name, fsync, rename; returns its size.

    A crash at any moment leaves either the old state or the complete file, never a partial file
    under the final name. A leftover temporary file is harmless (readers skip hidden names). No link
    is followed: the temporary file is made new (a link planted at its name is refused), the
    rename replaces a link at the final name rather than writing through it, and below an anchored
    output directory its directories are reached without links (hsmon/contracts/nofollow.py).
    """
    final = Path(final)
    dir_fd, name = nofollow.parent_dir(final, create=True)
    try:
        tmp = temporary_path(Path(name)).name
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)  # a leftover of this PID's earlier life (or a planted link)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                         dir_fd=dir_fd)
        except FileExistsError:
            raise nofollow.refusal(final.parent / tmp) from None
        try:
            with os.fdopen(fd, "wb") as fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
                size = fh.tell()
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return size


def append_jsonl(path: str | os.PathLike[str], records: Iterable[dict[str, Any]], fsync: bool = True) -> None:
    """Append records as JSON lines in one write, then fsync (the manifest's durability point)."""
    payload = "".join(json.dumps(r, separators=(",", ":"), allow_nan=False) + "\n" for r in records)
    if payload:
        append_bytes(path, payload.encode("utf-8"), fsync)


def append_bytes(path: str | os.PathLike[str], data: bytes, fsync: bool = True) -> int:
    """Append ``data`` in one write, then fsync; returns the file's size after it. On a failure
    (ENOSPC after a partial write) the file is cut back to its size before, so that a retry does not
    glue a good line onto half of one. No link followed (hsmon/contracts/nofollow.py)."""
    fd = nofollow.open_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        size_before = os.fstat(fd).st_size
        if not data:
            return size_before
        written = 0
        try:
            while written < len(data):
                written += os.write(fd, data[written:])
            if fsync:
                os.fsync(fd)
        except OSError:
            os.ftruncate(fd, size_before)
            raise
        return size_before + written
    finally:
        os.close(fd)


def repair_jsonl_tail(path: str | os.PathLike[str]) -> int:
    """Cut a partial last line (a write killed midway) so appends start on a fresh line.

    Only the file's single writer may call this. Returns the number of bytes removed.
    """
    try:
        fd = nofollow.open_file(path, os.O_RDWR)
    except FileNotFoundError:
        return 0
    try:
        size = os.fstat(fd).st_size
        keep = size
        while keep > 0:
            step = min(65536, keep)
            chunk = os.pread(fd, step, keep - step)
            if keep == size and chunk.endswith(b"\n"):
                return 0
            cut = chunk.rfind(b"\n")
            if cut >= 0:
                keep = keep - step + cut + 1
                break
            keep -= step
        os.ftruncate(fd, keep)
        os.fsync(fd)
        return size - keep
    finally:
        os.close(fd)


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Objects of a JSON Lines file; a bad or partial line is skipped."""
    try:
        fh = open(path, "rb")  # noqa: SIM115
    except FileNotFoundError:
        return
    with fh:
        for raw in fh:
            if not raw.endswith(b"\n"):
                break  # partial last line: a write that did not finish
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            if isinstance(obj, dict):
                yield obj


def manifest_paths(out_dir: str | os.PathLike[str]) -> list[Path]:
    return sorted(Path(out_dir).glob(MANIFEST_GLOB))


ENDING_TYPES = ("done", "stopped")
PLAN_KEYS = ("rows_total", "tokens_total", "chunks_total")


@dataclass
class RunLog:
    """How one manifest's latest run stands: its ``run`` record (with the plan) and its ending."""

    run: dict[str, Any] | None = None
    ending: dict[str, Any] | None = None  # a done/stopped record after the last run record

    def add(self, record: dict[str, Any]) -> None:
        kind = record.get("type")
        if kind == "run":
            self.run, self.ending = record, None
        elif kind in ENDING_TYPES and self.run is not None:
            self.ending = record

    @property
    def shard(self) -> tuple[int, int]:
        shard = ((self.run or {}).get("settings") or {}).get("shard") or [0, 1]
        try:
            return int(shard[0]), int(shard[1])
        except (TypeError, ValueError, IndexError):
            return 0, 1


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def summarize_runs(logs: Iterable[RunLog]) -> dict[str, Any]:
    """The plan and the ending of a directory's manifests (one per shard), as plain figures.

    ``rows_total``/``tokens_total``/``chunks_total``: the sum of every shard's plan, None when a
    manifest carries none (written before plans existed). ``ending``: "done" when every manifest's
    latest run wrote a ``done`` record, "stopped" when each ended and one of them stopped, else
    None (running, killed, or an older manifest). ``ending_ts``: the last ending's time;
    ``run_seconds``: the longest ending run's ``seconds``; ``shards_missing``: shards that the
    manifests' shard count names but this directory has no manifest of.
    """
    logs = [log for log in logs if log.run is not None]
    totals: dict[str, int | None] = dict.fromkeys(PLAN_KEYS, None)
    for key in PLAN_KEYS:
        values = [_int((log.run or {}).get(key)) for log in logs]
        if values and None not in values:
            totals[key] = sum(v for v in values if v is not None)
    endings = [log.ending for log in logs]
    ended = [e for e in endings if e is not None]
    ending = None
    if logs and len(ended) == len(logs):
        ending = "done" if all(e.get("type") == "done" for e in ended) else "stopped"

    def latest(key: str) -> float | None:
        values = [float(e[key]) for e in ended if isinstance(e.get(key), (int, float))]
        return max(values) if ending and values else None

    seen = {log.shard for log in logs}
    count = max((c for _, c in seen), default=1)
    return {
        **totals,
        "ending": ending,
        "ending_ts": latest("ts"),
        "run_seconds": latest("seconds"),
        "shards_missing": max(0, count - len({i for i, c in seen if c == count})) if logs else 0,
    }

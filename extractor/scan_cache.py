"""The dataset scan, cached: a resumed or repeated `hsmon extract` over the same dataset does not
tokenize it again (300,000 conversations take many minutes to tokenize; hashing them, seconds).

The key is the dataset's sha256 with everything that changes the scan's result: the tokenizer's
files (the model fingerprint), the tokenizer libraries' versions, the limits and which rows this
shard owns. Entries live in ``$HSMON_CACHE/scans`` (default ~/.cache/hsmon/scans), one small file
each (a JSON header line, then two int64 arrays: 16 bytes a row), written atomically, the 32 most recent
kept; an unreadable entry is scanned again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from array import array
from pathlib import Path
from typing import Any

from extractor import dataset as ds
from extractor.errors import log
from hsmon.contracts import layout
from hsmon.contracts.units import format_bytes

SCAN_VERSION = 1  # bump when the scan's result for the same inputs changes
KEEP_ENTRIES = 32  # the most recent scans kept (each ~16 bytes a row)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(8 * 1024 * 1024):
            digest.update(block)
    return digest.hexdigest()


def scan_key(sha256: str, fingerprint: str, limits: ds.Limits, owner: str) -> str:
    import tokenizers
    import transformers

    parts = [SCAN_VERSION, sha256, fingerprint, transformers.__version__, tokenizers.__version__,
             limits.vocab_size, limits.max_length, limits.truncate, owner]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def cached_scan(path: Path, tokenizer: Any, limits: ds.Limits, *, fingerprint: str, owner: str, owns: Any,
                progress: ds.ScanProgress | None = None, cache_dir: Path | None = None
                ) -> tuple[ds.ScanResult, bool]:
    """(the scan of ``path``, whether it came from the cache). ``owner`` names what ``owns`` selects
    (e.g. "shard 0/1, chunk 2000")."""
    from extractor.embedded_target import default_cache_dir

    sha = file_sha256(path)
    entry = (cache_dir or default_cache_dir() / "scans") / f"{scan_key(sha, fingerprint, limits, owner)}.scan"
    loaded = _load(entry, sha)
    if loaded is not None:
        return loaded, True
    result = ds.scan(path, tokenizer, limits, owns=owns, progress=progress)
    if result.sha256 == sha:  # the file did not change while it was read
        with contextlib.suppress(OSError):  # a cache not written costs the next run a scan, nothing else
            _save(entry, result)
            _prune(entry.parent)
    return result, False


def _prune(directory: Path, keep: int = KEEP_ENTRIES) -> None:
    """Remove all but the ``keep`` most recently written entries."""
    entries = sorted(directory.glob("*.scan"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in entries[keep:]:
        old.unlink(missing_ok=True)


def _save(entry: Path, result: ds.ScanResult) -> None:
    """A JSON header line, then the rows' and the lengths' int64 arrays (no copy of them is made)."""
    rows, lengths = result.rows, result.lengths
    if not isinstance(rows, array) or not isinstance(lengths, array):
        rows, lengths = array("q", rows or ()), array("q", lengths or ())
    header = {"v": SCAN_VERSION, "sha256": result.sha256, "lines": result.lines,
              "truncated": result.truncated, "rows": len(rows),
              "rejects": [[r.index, r.reason, r.line] for r in result.rejects or ()]}

    def write(fh: Any) -> None:
        fh.write(json.dumps(header).encode() + b"\n")
        rows.tofile(fh)
        lengths.tofile(fh)

    layout.atomic_write(entry, write)


def _load(entry: Path, sha256: str) -> ds.ScanResult | None:
    try:
        with open(entry, "rb") as fh:
            header = json.loads(fh.readline())
            if header.get("v") != SCAN_VERSION or header.get("sha256") != sha256:
                return None
            rows, lengths = array("q"), array("q")
            rows.fromfile(fh, int(header["rows"]))
            lengths.fromfile(fh, int(header["rows"]))
            if fh.read(1):
                return None
        rejects = [ds.Reject(int(i), str(reason), int(line)) for i, reason, line in header["rejects"]]
    except (OSError, ValueError, KeyError, TypeError, EOFError):
        return None
    return ds.ScanResult(lines=int(header["lines"]), rows=rows, lengths=lengths,  # type: ignore[arg-type]
                         rejects=rejects, truncated=int(header["truncated"]), sha256=sha256)


class ScanLog:
    """Says how far the dataset scan is, every ``every`` seconds (a large dataset takes minutes)."""

    def __init__(self, data: Path, every: float = 5.0) -> None:
        self.data, self.every = data, every
        self.size = max(1, data.stat().st_size)
        self.started = self.last = time.monotonic()

    def __call__(self, rows: int, read: int) -> None:
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            log(f"scanning {self.data}: {rows} rows, {100 * read / self.size:.0f} % of "
                f"{format_bytes(self.size)} in {now - self.started:.0f} s")

"""Everything ``hsmon extract`` knows before any weight is loaded: options and inputs checked, the
dataset scanned, the model's facts read, what earlier runs already wrote, and the disk headroom.

Resume rule: a run with different settings (dataset content, model, dtype, device type, layers,
lengths, chunk size, sharding) than the one that started ``--out`` is refused, because its rows
would not match the ones already written; the batch budget and the other options of how rows are
computed (threads, concurrency, heartbeat, disk reserve) may change.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from extractor import dataset as ds
from extractor.errors import UsageError, log
from extractor.plan import Shard, parse_layers, row_bytes
from extractor.scan_cache import ScanLog, cached_scan
from extractor.server_prep import server_dtype, server_options
from extractor.spool_gate import spool_max_of
from extractor.spool_limit import check_limit, heldout_rule, spool_need
from extractor.targets import ModelUnavailable, check_model_arg
from hsmon.contracts import layout, nofollow, regen_layout, writer_lock
from hsmon.contracts.manifest_reader import Manifest, RowSet, read_manifest, read_row_records
from hsmon.contracts.units import format_bytes, parse_size
from hsmon.contracts.writer_lock import WriterLock

DEFAULT_MIN_FREE = "1G"
DEFAULT_BATCH_TOKENS = 8192
# What a row holds, and where: a resume that changes one of these is refused. The batch budget,
# threads, concurrency, heartbeat and disk reserve are not here: they change how rows are computed
# (rows batched with others or alone: equal to float rounding), not what they are.
RESUME_KEYS = ("dataset_sha256", "model_fingerprint", "backend", "dtype", "device_type", "layers",
               "max_length", "truncate", "chunk_size", "shard")


def model_fingerprint(model_dir: Path) -> str:
    """sha256 of the config and tokenizer files and the weight files' names and sizes."""
    digest = hashlib.sha256()
    for path in sorted(model_dir.iterdir()):
        if not path.is_file():
            continue
        if path.suffix in (".json", ".txt", ".model", ".jinja"):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
        elif path.suffix in (".safetensors", ".bin", ".pt"):
            digest.update(f"{path.name}\0{path.stat().st_size}".encode())
    return digest.hexdigest()


def resolve_model(model: str | None) -> Path:
    """The model directory of ``--model``: a directory, a preset name (`extractor.targets`), or the
    embedded target when none is given."""
    from extractor import targets

    try:
        return targets.resolve_model(model, "--model")
    except ModelUnavailable as exc:
        raise UsageError(str(exc)) from None


@dataclass
class Prepared:
    """Everything known before any weight is loaded."""

    data: Path
    out: Path
    model_dir: Path
    shard: Shard
    chunk_size: int
    batch_tokens: int
    min_free: int
    layers: list[int]
    num_layers: int
    hidden_size: int
    dtype: str
    device: str
    limits: ds.Limits
    tokenizer: Any
    scan: ds.ScanResult
    settings: dict[str, Any]
    manifest_path: Path
    done: RowSet
    done_tokens: int
    done_bytes: int
    manifest: Manifest  # running totals; keeps the row records of chunks not complete yet
    bytes_needed: int
    bytes_free: int
    job: str
    backend_options: dict[str, Any] = field(default_factory=dict)
    # valid rows a backend rejected in an earlier run (a server's refusal ...): final, like done rows
    late_rejects: dict[int, str] = field(default_factory=dict)
    # --spool-max in bytes (extractor/spool_gate.py): the output is a spool a following trainer consumes
    spool_max: int | None = None
    lock: WriterLock | None = None  # this run's hold on --out (one writer per output), for its life


def lock_output(out: Path, shard: Shard) -> WriterLock:
    """Hold --out (this shard's part of it) for the run's life, before its manifest is read: a second
    writer is refused in one line naming the first's PID and host (contracts/writer_lock.py)."""
    name = writer_lock.extract_lock_name(shard.as_tuple)
    try:
        return writer_lock.acquire(out, name, "hsmon extract", "--out")
    except writer_lock.OutputLocked as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:  # a planted link names itself; anything else names --out
        raise UsageError(exc.strerror if isinstance(exc, nofollow.LinkRefused) else
                         f"--out {out}: {exc.strerror or exc} (give a directory you can write)") from None


def prepare(args: argparse.Namespace) -> Prepared:
    """Check options and inputs, scan the dataset, read what is already done."""
    data, shard, min_free = _check_arguments(args)
    spool_max = spool_max_of(args)

    import torch
    from transformers import AutoConfig, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from extractor.backends.hf import model_facts, resolve_device, resolve_dtype

    hf_logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = resolve_model(args.model)
    config = AutoConfig.from_pretrained(str(model_dir))
    num_layers, hidden, vocab, max_pos = model_facts(config)
    served = args.backend in ("sglang", "vllm")  # by servers over HTTP
    try:
        layers = parse_layers(args.layers, num_layers)
        device = args.backend if served else resolve_device(args.device)
        # --dtype auto: the computing engine's own dtype (the servers', agreed in the preflight below)
        dtype = (server_dtype(args.dtype) if served
                 else str(resolve_dtype(args.dtype, device)).removeprefix("torch."))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    out = Path(args.out)
    job = args.job or _job_name(out, shard)
    sglang_options = None
    if served:  # the servers decide how long a row may be: asked before the dataset is read
        sglang_options, max_length, dtype = server_options(args, job, out, layers, dtype, config, max_pos)
    else:
        max_length = args.max_length or max_pos
        if max_length > max_pos:
            raise UsageError(f"--max-length {max_length} exceeds the model's {max_pos} positions")
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    limits = ds.Limits(vocab_size=vocab, max_length=max_length, truncate=not args.no_truncate)
    fingerprint = model_fingerprint(model_dir)
    scan, cached = _scan(data, tokenizer, limits, fingerprint, shard, args.chunk_size)
    settings = {
        "dataset": str(data.resolve()), "dataset_sha256": scan.sha256, "model": str(model_dir.resolve()),
        "model_fingerprint": fingerprint, "backend": args.backend, "dtype": dtype,
        "device_type": device.split(":")[0], "layers": layers, "max_length": max_length,
        "truncate": not args.no_truncate, "chunk_size": args.chunk_size, "batch_tokens": args.batch_tokens,
        "shard": [shard.index, shard.count],
    }
    manifest_path = out / layout.manifest_name(shard.as_tuple)
    # every refusal above leaves no --out behind; from here on this run holds it (one writer per output)
    lock = None if args.dry_run else lock_output(out, shard)
    check_resume(out, manifest_path, settings, server_dtype=served and args.dtype == "auto")
    if cached:  # after the checks: a refused command says one line
        log(f"dataset {data}: scanned before (same content and tokenizer), not tokenized again")
    element = torch.tensor([], dtype=getattr(torch, dtype)).element_size()
    manifest, book = _read_done(out, manifest_path, scan,
                                lambda length: row_bytes(length, hidden, len(layers), element))
    probe = out if out.exists() else next(p for p in out.absolute().parents if p.exists())
    free = shutil.disk_usage(probe).free
    prep = Prepared(data, out, model_dir, shard, args.chunk_size, args.batch_tokens, min_free, layers,
                    num_layers, hidden, dtype, device, limits, tokenizer, scan, settings, manifest_path,
                    book.done, book.done_tokens, book.done_bytes, manifest, book.needed, free, job,
                    late_rejects=book.late, spool_max=spool_max, lock=lock)
    if spool_max is not None:
        check_limit(spool_max, spool_need(scan, lambda n: row_bytes(n, hidden, len(layers), element),
                                          args.chunk_size, shard, heldout_rule(out)), args.chunk_size)
    if sglang_options is not None:
        from extractor.backends.base import ModelInfo

        opts = sglang_options
        opts.longest_row = book.longest_left or 1
        prep.backend_options = {"options": opts,
                                "info": ModelInfo(num_layers, hidden, vocab, max_pos, dtype, device)}
        settings.update(urls=opts.urls, transport=opts.transport)  # recorded, not compared on resume
    return prep


def _scan(data: Path, tokenizer: Any, limits: ds.Limits, fingerprint: str, shard: Shard,
          chunk_size: int) -> tuple[Any, bool]:
    """The dataset's scan (reused when the content and tokenizer are the same); refused in one line
    when it holds no row, or no usable one."""
    scan, cached = cached_scan(data, tokenizer, limits, fingerprint=fingerprint,
                               owner=f"shard {shard.index}/{shard.count}, chunk {chunk_size}",
                               owns=lambda i: shard.owns_row(i, chunk_size), progress=ScanLog(data))
    if scan.lines == 0:
        raise UsageError(f"dataset {data} has no rows (expected JSON Lines: one object per line)")
    if not scan.rows and scan.rejects:
        first = scan.rejects[0]
        raise UsageError(f"no usable row in {data}: all {len(scan.rejects)} rows rejected "
                         f"(row {first.index}, line {first.line}: {first.reason})")
    return scan, cached


def _check_arguments(args: argparse.Namespace) -> tuple[Path, Shard, int]:
    """The checks that need no model: (dataset path, shard, --min-free in bytes); raises UsageError."""
    data = dataset_path(Path(args.data))
    if not any(True for _ in ds.iter_lines(data)):
        raise UsageError(f"dataset {data} has no rows (expected JSON Lines: one object per line)")
    try:
        shard = Shard.parse(args.shard)
        min_free = parse_size(args.min_free)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.chunk_size < 1 or args.batch_tokens < 1:
        raise UsageError("--chunk-size and --batch-tokens must be at least 1")
    check_out_events_model(args)
    return data, shard, min_free


def dataset_path(data: Path) -> Path:
    """The dataset file of ``DATA``: the file itself, or a finished regeneration's dataset (`hsmon
    regenerate`'s --out); UsageError naming the fix for anything else."""
    if data.is_dir() and regen_layout.is_regeneration(data):
        unfinished = regen_layout.unfinished_reason(data)
        if unfinished is not None:
            raise UsageError(f"dataset {data}: {unfinished}; finish it (run the same hsmon regenerate "
                             f"again) or give {data / regen_layout.DATA_NAME} for the rows written so far")
        return data / regen_layout.DATA_NAME
    if not data.is_file():
        raise UsageError(f"dataset {data} not found (give a JSON Lines file, one row per line, or the --out "
                         "of a finished hsmon regenerate)")
    return data


def check_out_events_model(args: argparse.Namespace) -> None:
    """--out, --events and --model, checked before anything is loaded (UsageError); regenerate's too."""
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise UsageError(f"--out {args.out}: exists and is not a directory (give a directory)")
    events_dir = Path(args.events).absolute().parent if args.events else None
    # --out is made by the run (the units' --events OUT/events.jsonl): only another missing one is refused
    if events_dir is not None and not events_dir.is_dir() and events_dir != Path(args.out).absolute():
        raise UsageError(f"--events {args.events}: its directory does not exist (create it first)")
    try:
        check_model_arg(args.model, "--model")
    except ModelUnavailable as exc:
        raise UsageError(str(exc)) from None


def _job_name(out: Path, shard: Shard) -> str:
    """extract-<output dir name>[-shardIofN]; a directory named extract… keeps its name."""
    name = out.resolve().name
    base = name if name.startswith("extract") else f"extract-{name}"
    return base + (f"-shard{shard.index}of{shard.count}" if shard.count > 1 else "")


def _read_done(out: Path, manifest_path: Path, scan: ds.ScanResult,
               bytes_of: Callable[[int], int]) -> tuple[Manifest, ResumeBook]:
    """The manifest read so far and the resume book (rows done, their tokens and bytes, rows left)."""
    reasons = RejectReasons()
    manifest = (read_manifest(out, manifest_path.name, keep_open_rows=True, accumulators=[reasons])
                if manifest_path.exists() else Manifest(keep_open_rows=True))
    book = resume_book(scan, manifest, bytes_of, reasons.reasons)
    if len(book.done) != len(manifest.rows):  # rows the dataset no longer has: count only the others
        book.done_bytes = sum(int(r.get("bytes", 0)) for r in read_row_records(
            out, book.done, manifest_path.name).values())
    return manifest, book


@dataclass
class ResumeBook:
    """What a resume starts from, in one pass over the scan (no per-row dicts or sets)."""

    done: RowSet  # rows of this dataset the manifest has
    done_tokens: int = 0
    done_bytes: int = 0
    needed: int = 0  # bytes the rows still to extract will take
    longest_left: int = 0  # tokens of the longest row still to extract
    late: dict[int, str] = field(default_factory=dict)  # rows a backend rejected in an earlier run


@dataclass
class RejectReasons:
    """The reason of each reject record, folded while the manifest is read (rejects are few)."""

    reasons: dict[int, str] = field(default_factory=dict)

    def add(self, record: dict[str, Any]) -> None:
        if record.get("type") == "reject" and isinstance(record.get("row"), int):
            self.reasons.setdefault(record["row"], str(record.get("reason", "")))


def resume_book(scan: ds.ScanResult, manifest: Manifest, size_of: Any,
                reasons: dict[int, str] | None = None) -> ResumeBook:
    """Done rows, their tokens and bytes, and what is left, from the scan and the manifest's totals
    (``size_of(tokens)``: a row's bytes on disk). A row the scan accepted but the manifest records
    as rejected was rejected by a backend in an earlier run: it is ``late`` (``reasons``: why)."""
    book = ResumeBook(RowSet(), done_bytes=manifest.bytes)
    for row, length in zip(scan.rows or (), scan.lengths or (), strict=True):
        if row in manifest.rows:
            book.done.add(row)
            book.done_tokens += length
        elif row in manifest.rejects:
            book.late[row] = (reasons or {}).get(row, "")
        else:
            book.needed += size_of(length)
            book.longest_left = max(book.longest_left, length)
    return book


def check_resume(out: Path, manifest_path: Path, settings: dict[str, Any],
                 server_dtype: bool = False) -> None:
    """Refuse to continue a run whose written rows were computed with other settings, or other
    sharding in the same dir. Only a run that wrote a row (or a reject) binds: one that wrote none
    (refused at its first row, stopped before it) leaves every setting free. ``server_dtype``: the
    dtype is the servers' (--backend sglang, --dtype auto), so a mismatch names the server's flag."""
    for path in layout.manifest_paths(out):
        old = binding_settings(path)
        if old is None:
            continue
        if path != manifest_path:
            if old.get("shard", [0, 1])[1] != settings["shard"][1]:
                raise UsageError(f"{out} holds a run split into {old.get('shard', [0, 1])[1]} shard(s) "
                                 f"({path.name}); use the same --shard count or a new --out")
            keys = [k for k in RESUME_KEYS if k != "shard"]
        else:
            keys = list(RESUME_KEYS)
        for key in keys:
            if old.get(key) == settings[key]:
                continue
            if key == "dtype" and server_dtype:
                was = old.get(key)
                raise UsageError(f"{out} holds rows in {was}, the server computes in {settings[key]}: "
                                 f"relaunch it with --dtype {was} (hsmon sglang-serve ... -- --dtype {was}) "
                                 "to go on, or use a new --out")
            raise UsageError(f"{out} was started with different settings ({key}: {old.get(key)!r}, now "
                             f"{settings[key]!r}); resume with the same command, or use a new --out")


def binding_settings(path: Path) -> dict[str, Any] | None:
    """The settings of the run that wrote the manifest's first row or reject record (what the rows
    written hold), or None when no run wrote one. Reads up to that record only."""
    latest: dict[str, Any] | None = None
    for record in layout.iter_jsonl(path):
        kind = record.get("type")
        if kind == "run":
            latest = record.get("settings") if isinstance(record.get("settings"), dict) else {}
        elif kind in ("row", "reject", "chunk"):
            return latest if latest is not None else {}
    return None


def needed_on_disk(prep: Prepared) -> int:
    """The bytes the output will hold at most: the rows left, or for a spool its limit."""
    if prep.spool_max is not None:
        return min(prep.bytes_needed, prep.spool_max)
    return prep.bytes_needed


def fits(prep: Prepared) -> bool:
    return prep.bytes_free - needed_on_disk(prep) >= prep.min_free


def headroom_line(prep: Prepared) -> str:
    verdict = "fits" if fits(prep) else "does NOT fit: the run will pause when free space reaches the reserve"
    spool = "" if prep.spool_max is None else f" (a spool: at most {format_bytes(prep.spool_max)} at once)"
    return (f"needs ~{format_bytes(prep.bytes_needed)}{spool}, {format_bytes(prep.bytes_free)} free "
            f"(reserve {format_bytes(prep.min_free)}): {verdict}")


def dry_run(prep: Prepared) -> int:
    """Print rows, tokens and bytes and whether they fit; exit 0 when they fit, 1 when not."""
    scan = prep.scan
    rows = len(scan.rows or ())
    print(f"dataset {prep.data}: {scan.lines} rows, {rows} usable in this shard, {len(scan.rejects or ())} "
          f"rejected, {scan.truncated} truncated")
    print(f"tokens {scan.tokens} (done {prep.done_tokens}); rows to extract {rows - len(prep.done)}")
    print(f"model {prep.model_dir}: {prep.num_layers} layers, hidden {prep.hidden_size}, {prep.dtype}, "
          f"capture points {prep.layers}")
    print(f"output {prep.out}: {headroom_line(prep)}")
    print(f"RESULT rows={rows} tokens={scan.tokens} bytes={prep.bytes_needed} free={prep.bytes_free} "
          f"fits={'yes' if fits(prep) else 'no'}")
    return 0 if fits(prep) else 1

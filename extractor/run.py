"""The extraction loop: scan, check, resume, compute, hand rows to the writer, report.

Resume rule: a row is done when the shard's manifest has its ``row`` record. The same command
continues where any earlier run of it stopped (cleanly or by ``kill -9``); a run with different
settings (dataset content, model, dtype, device type, layers, lengths, chunk size, batch budget,
sharding) is refused, because its rows would not match the ones already written.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extractor import dataset as ds
from extractor.plan import Shard, parse_layers, plan_batches, row_bytes
from hsmon import events as ev
from hsmon import layout
from hsmon.units import format_bytes, format_duration, parse_size

DEFAULT_MIN_FREE = "1G"
DEFAULT_BATCH_TOKENS = 8192
# Settings that change what is written: a resume must match them exactly.
RESUME_KEYS = ("dataset_sha256", "model_fingerprint", "backend", "dtype", "device_type", "layers",
               "max_length", "truncate", "chunk_size", "batch_tokens", "shard")


class UsageError(Exception):
    """Bad input or options: printed as one line, exit status 2."""


def log(message: str) -> None:
    """A line for the human, on stderr (stdout may carry the event stream)."""
    print(f"hsmon extract: {message}", file=sys.stderr, flush=True)


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
    if model:
        path = Path(model)
        if not (path / "config.json").is_file():
            raise UsageError(f"--model {model}: not a Hugging Face model directory (no config.json)")
        return path
    try:
        from extractor.embedded_target import ensure_embedded_target
    except ImportError:
        raise UsageError("the embedded target is not available in this build; pass --model DIR") from None
    return Path(ensure_embedded_target())


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
    done: set[int]
    done_tokens: int
    done_bytes: int
    manifest: layout.Manifest
    bytes_needed: int
    bytes_free: int
    job: str


def prepare(args: argparse.Namespace) -> Prepared:
    """Check options and inputs, scan the dataset, read what is already done."""
    data = Path(args.data)
    if not data.is_file():
        raise UsageError(f"dataset {data} not found (give a JSON Lines file, one row per line)")
    if not any(True for _ in ds.iter_lines(data)):
        raise UsageError(f"dataset {data} has no rows (expected JSON Lines: one object per line)")
    try:
        shard = Shard.parse(args.shard)
        min_free = parse_size(args.min_free)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.chunk_size < 1 or args.batch_tokens < 1:
        raise UsageError("--chunk-size and --batch-tokens must be at least 1")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise UsageError(f"--out {args.out}: exists and is not a directory (give a directory)")
    if args.events and not Path(args.events).absolute().parent.is_dir():
        raise UsageError(f"--events {args.events}: its directory does not exist (create it first)")
    if args.model and not (Path(args.model) / "config.json").is_file():
        raise UsageError(f"--model {args.model}: not a Hugging Face model directory (no config.json)")

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
    try:
        layers = parse_layers(args.layers, num_layers)
        device = resolve_device(args.device)
        dtype = str(resolve_dtype(args.dtype, device)).removeprefix("torch.")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    max_length = args.max_length or max_pos
    if max_length > max_pos:
        raise UsageError(f"--max-length {max_length} exceeds the model's {max_pos} positions")
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    limits = ds.Limits(vocab_size=vocab, max_length=max_length, truncate=not args.no_truncate)
    scan = ds.scan(data, tokenizer, limits, owns=lambda i: shard.owns_row(i, args.chunk_size))
    if scan.lines == 0:
        raise UsageError(f"dataset {data} has no rows (expected JSON Lines: one object per line)")
    if not scan.rows and scan.rejects:
        first = scan.rejects[0]
        raise UsageError(f"no usable row in {data}: all {len(scan.rejects)} rows rejected "
                         f"(row {first.index}, line {first.line}: {first.reason})")
    out = Path(args.out)
    settings = {
        "dataset": str(data.resolve()), "dataset_sha256": scan.sha256, "model": str(model_dir.resolve()),
        "model_fingerprint": model_fingerprint(model_dir), "backend": args.backend, "dtype": dtype,
        "device_type": device.split(":")[0], "layers": layers, "max_length": max_length,
        "truncate": not args.no_truncate, "chunk_size": args.chunk_size, "batch_tokens": args.batch_tokens,
        "shard": [shard.index, shard.count],
    }
    manifest_path = out / layout.manifest_name(shard.as_tuple)
    check_resume(out, manifest_path, settings)
    manifest = layout.read_manifest(out, manifest_path.name) if manifest_path.exists() else layout.Manifest()
    valid = set(scan.rows or ())
    done = {row for row in manifest.rows if row in valid}
    lengths = dict(zip(scan.rows or (), scan.lengths or (), strict=True))
    element = torch.tensor([], dtype=getattr(torch, dtype)).element_size()
    needed = sum(row_bytes(lengths[r], hidden, len(layers), element) for r in valid - done)
    probe = out if out.exists() else next(p for p in out.absolute().parents if p.exists())
    free = shutil.disk_usage(probe).free
    job = args.job or f"extract-{out.resolve().name}" + (f"-shard{shard.index}of{shard.count}"
                                                         if shard.count > 1 else "")
    return Prepared(data, out, model_dir, shard, args.chunk_size, args.batch_tokens, min_free, layers,
                    num_layers, hidden, dtype, device, limits, tokenizer, scan, settings, manifest_path, done,
                    sum(lengths[r] for r in done), sum(int(manifest.rows[r].get("bytes", 0)) for r in done),
                    manifest, needed, free, job)


def check_resume(out: Path, manifest_path: Path, settings: dict[str, Any]) -> None:
    """Refuse to continue a run started with other settings, or other sharding in the same dir."""
    for path in layout.manifest_paths(out):
        first = next((r for r in layout.iter_jsonl(path) if r.get("type") == "run"), None)
        if first is None:
            continue
        old = first.get("settings", {})
        if path != manifest_path:
            if old.get("shard", [0, 1])[1] != settings["shard"][1]:
                raise UsageError(f"{out} holds a run split into {old.get('shard', [0, 1])[1]} shard(s) "
                                 f"({path.name}); use the same --shard count or a new --out")
            keys = [k for k in RESUME_KEYS if k != "shard"]
        else:
            keys = list(RESUME_KEYS)
        for key in keys:
            if old.get(key) != settings[key]:
                raise UsageError(f"{out} was started with different settings ({key}: {old.get(key)!r}, now "
                                 f"{settings[key]!r}); resume with the same command, or use a new --out")


def fits(prep: Prepared) -> bool:
    return prep.bytes_free - prep.bytes_needed >= prep.min_free


def headroom_line(prep: Prepared) -> str:
    verdict = "fits" if fits(prep) else "does NOT fit: the run will pause when free space reaches the reserve"
    return (f"needs ~{format_bytes(prep.bytes_needed)}, {format_bytes(prep.bytes_free)} free "
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


def clean_temporaries(out: Path, book_starts: list[int], chunk_size: int) -> None:
    """Remove leftover temporary files in this shard's chunk directories (a killed write)."""
    for start in book_starts:
        chunk = out / layout.chunk_dir_name(start, start + chunk_size)
        if chunk.is_dir():
            for path in chunk.iterdir():
                if layout.is_temporary(path.name):
                    path.unlink(missing_ok=True)


class ProgressLine:
    """A one-line progress display on stderr, only when stderr is a terminal."""

    def __init__(self, progress: Any) -> None:
        self.progress = progress
        self.enabled = sys.stderr.isatty()
        self.started = time.monotonic()
        self.first_tokens: int | None = None

    def update(self) -> None:
        if not self.enabled:
            return
        snap = self.progress.snapshot()
        if self.first_tokens is None:
            self.first_tokens = snap["tokens_done"]
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = (snap["tokens_done"] - self.first_tokens) / elapsed
        left = snap["tokens_total"] - snap["tokens_done"]
        pct = 100.0 * snap["rows_done"] / max(snap["rows_total"], 1)
        eta = format_duration(left / rate) if rate > 0 else "-"
        state = f"  PAUSED ({snap['paused']})" if snap["paused"] else ""
        sys.stderr.write(f"\r{snap['rows_done']}/{snap['rows_total']} rows {pct:5.1f}%  {rate:,.0f} tok/s  "
                         f"{format_bytes(snap['bytes_done'])}  eta {eta}{state}   ")
        sys.stderr.flush()

    def end(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def heartbeat_loop(events: ev.EventWriter, progress: Any, interval: float, quit_event: threading.Event,
                   on_beat: Any = None) -> None:
    while not quit_event.wait(interval):
        events.emit(ev.HEARTBEAT, **progress.snapshot())
        if on_beat is not None:
            on_beat()  # keeps the terminal line fresh while paused


def main(args: argparse.Namespace) -> int:
    """Run `hsmon extract`; returns the exit status."""
    try:
        prep = prepare(args)
    except UsageError as exc:
        log(str(exc))
        return 2
    if args.dry_run:
        return dry_run(prep)
    log(f"{len(prep.scan.rows or ())} rows, {prep.scan.tokens} tokens -> {prep.out}; {headroom_line(prep)}")
    return extract(prep, args)


def extract(prep: Prepared, args: argparse.Namespace) -> int:
    from extractor.backends import create_backend
    from extractor.writer import ChunkBook, Progress, RowItem, RowWriter

    scan = prep.scan
    rows, lengths = list(scan.rows or ()), list(scan.lengths or ())
    rejects = scan.rejects or []
    prep.out.mkdir(parents=True, exist_ok=True)
    layout.repair_jsonl_tail(prep.manifest_path)

    expected: dict[int, int] = {}
    for index in rows + [r.index for r in rejects]:
        start = layout.chunk_bounds(index, prep.chunk_size)[0]
        expected[start] = expected.get(start, 0) + 1
    book = ChunkBook(prep.chunk_size, expected, recorded=set(prep.manifest.chunks))
    for row in sorted(prep.done):
        book.add_row(prep.manifest.rows[row])
    clean_temporaries(prep.out, sorted(expected), prep.chunk_size)

    stop_event = threading.Event()
    quit_heartbeat = threading.Event()
    events = ev.EventWriter(prep.job, path=args.events)
    chunks_recorded = sum(
        layout.chunk_dir_name(start, start + prep.chunk_size) in prep.manifest.chunks for start in expected
    )
    progress = Progress(rows_total=len(rows), tokens_total=scan.tokens, rows_done=len(prep.done),
                        tokens_done=prep.done_tokens, bytes_done=prep.done_bytes, rejects=len(rejects),
                        chunks_done=chunks_recorded)
    previous = install_stop_handlers(stop_event)  # a signal during model loading also stops cleanly
    try:
        backend = create_backend(args.backend, str(prep.model_dir), capture_points=prep.layers,
                                 device=prep.device, dtype=prep.dtype)
    except Exception as exc:
        events.emit(ev.ERROR, message=f"cannot load the model: {exc}")
        log(f"cannot load the model {prep.model_dir}: {exc}")
        restore_handlers(previous)
        return 1
    events.emit(ev.START, rows_total=len(rows), tokens_total=scan.tokens, rows_done=len(prep.done),
                tokens_done=prep.done_tokens, rejects=len(rejects), chunks_total=len(expected),
                chunks_done=chunks_recorded, layers=prep.layers,
                num_layers=prep.num_layers, hidden_size=prep.hidden_size, dtype=prep.dtype,
                out_dir=str(prep.out.resolve()), pid=os.getpid(), backend=backend.name,
                model=str(prep.model_dir), device=prep.device, chunk_size=prep.chunk_size,
                shard=[prep.shard.index, prep.shard.count], bytes_needed=prep.bytes_needed,
                bytes_free=prep.bytes_free, resumed=bool(prep.done or prep.manifest.rejects))
    started = time.monotonic()

    line = ProgressLine(progress)
    writer = RowWriter(prep.out, prep.manifest_path, book, prep.layers, events, progress, stop_event,
                       prep.min_free, poll_seconds=args.disk_poll, on_rows=line.update)
    try:
        # through the writer, so that a disk already full at start pauses instead of failing
        writer.append([{"type": "run", "settings": prep.settings, "pid": os.getpid(), "started": time.time(),
                        "rows_done": len(prep.done), "job": prep.job}])
        record_rejects(prep, rejects, book, events, writer)
        writer.write_completed_chunks()  # chunks finished by an earlier run just before it died
    except Exception as exc:  # includes a stop requested while paused for disk
        restore_handlers(previous)
        backend.close()
        if stop_event.is_set():
            events.emit(ev.STOPPED, reason="signal", seconds=0.0, **progress.snapshot())
            events.close()
            return 0
        events.emit(ev.ERROR, message=f"{type(exc).__name__}: {exc}", **progress.snapshot())
        events.close()
        log(f"error: {type(exc).__name__}: {exc}")
        return 1
    writer.start()
    heartbeat = threading.Thread(target=heartbeat_loop, name="hsmon-heartbeat", daemon=True,
                                 args=(events, progress, args.heartbeat, quit_heartbeat, line.update))
    heartbeat.start()
    error: str | None = None
    try:
        fetch = RowFetcher(prep.data, prep.tokenizer, prep.limits)
        for batch in plan_batches(rows, lengths, prep.chunk_size, prep.batch_tokens):
            if stop_event.is_set() or writer.error is not None or writer.abandoned:
                break
            indices = [rows[p] for p in batch]
            if all(i in prep.done for i in indices):
                continue
            got = fetch.rows(indices)
            for row, pos in zip(got, batch, strict=True):
                if len(row.input_ids) != lengths[pos]:
                    raise RuntimeError(f"dataset {prep.data} changed during the run (row {row.index})")
            states = backend.extract([r.input_ids for r in got])
            items = [RowItem(r.index, r.input_ids, r.loss_mask, s.hidden_state, s.aux_hidden_state)
                     for r, s in zip(got, states, strict=True) if r.index not in prep.done]
            if not writer.submit(items):
                break
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    writer.finish()
    quit_heartbeat.set()
    heartbeat.join()
    line.end()
    backend.close()
    restore_handlers(previous)
    if writer.error is not None and error is None:
        error = f"writing failed: {type(writer.error).__name__}: {writer.error}"
    snap = progress.snapshot()
    seconds = round(time.monotonic() - started, 3)
    try:
        if error is not None:
            events.emit(ev.ERROR, message=error, **snap)
            log(f"error: {error}")
            return 1
        if snap["rows_done"] < snap["rows_total"]:
            if not stop_event.is_set():
                events.emit(ev.ERROR, message="the run ended with rows left (writer gave up)", **snap)
                return 1
            events.emit(ev.STOPPED, reason="signal", seconds=seconds, **snap)
            log(f"stopped at {snap['rows_done']}/{snap['rows_total']} rows; run the same command to resume")
            return 0
        events.emit(ev.DONE, seconds=seconds, out_dir=str(prep.out.resolve()), **snap)
        log(f"done: {snap['rows_done']} rows, {snap['tokens_done']} tokens, "
            f"{format_bytes(snap['bytes_done'])} in {prep.out} ({len(rejects)} rejected)")
        return 0
    finally:
        events.close()


def record_rejects(prep: Prepared, rejects: list[ds.Reject], book: Any, events: ev.EventWriter,
                   writer: Any) -> None:
    """Write rejects not yet in the manifest to the rejects file, the manifest and the events."""
    rejects_path = prep.out / layout.rejects_name(prep.shard.as_tuple)
    layout.repair_jsonl_tail(rejects_path)
    listed = {r.get("row") for r in layout.iter_jsonl(rejects_path)}
    new = [r for r in rejects if r.index not in prep.manifest.rejects]
    lines = [{"row": r.index, "line": r.line, "reason": r.reason} for r in new if r.index not in listed]
    writer.append(lines, path=rejects_path)
    writer.append([{"type": "reject", "row": r.index, "reason": r.reason} for r in new])
    for r in rejects:
        book.add_reject(r.index)
    for r in new:
        events.emit(ev.REJECT, row=r.index, line=r.line, reason=r.reason)


class RowFetcher:
    """Reads the dataset once more, front to back, tokenizing only the rows asked for."""

    def __init__(self, path: Path, tokenizer: Any, limits: ds.Limits) -> None:
        self.lines = ds.iter_lines(path)
        self.tokenizer, self.limits = tokenizer, limits

    def rows(self, indices: list[int]) -> list[ds.Row]:
        got = []
        for want in indices:
            for index, line_no, raw in self.lines:
                if index == want:
                    parsed = ds.parse_row(raw, index, self.tokenizer, self.limits, line_no)
                    if not isinstance(parsed, ds.Row):
                        raise RuntimeError(f"row {index} became invalid during the run: {parsed.reason}")
                    got.append(parsed)
                    break
            else:
                raise RuntimeError(f"row {want} is missing: the dataset changed during the run")
        return got


def install_stop_handlers(stop_event: threading.Event) -> dict[int, Any]:
    """First SIGTERM/SIGINT: stop at the next row boundary. A second one: leave at once."""

    def handler(signum: int, _frame: Any) -> None:
        if stop_event.is_set():
            os._exit(128 + signum)
        stop_event.set()

    previous = {}
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(ValueError):  # not the main thread (tests calling main in a thread)
            previous[signum] = signal.signal(signum, handler)
    return previous


def restore_handlers(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)

"""The extraction loop: scan, check, resume, compute, hand rows to the writer, report.

Resume rule: a row is done when the shard's manifest has its ``row`` record. The same command
continues where any earlier run of it stopped (cleanly or by ``kill -9``); a run with different
settings (dataset content, model, dtype, device type, layers, lengths, chunk size, batch budget,
sharding) is refused, because its rows would not match the ones already written.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from extractor import dataset as ds
from extractor.errors import UsageError, log
from extractor.plan import plan_batches
from extractor.prepare import Prepared, dry_run, headroom_line, prepare
from hsmon.contracts import events as ev
from hsmon.contracts import layout, progress_line, stop_signals
from hsmon.contracts.rejects import count_by_class, summary
from hsmon.contracts.units import format_bytes, format_duration


def clean_temporaries(out: Path, book_starts: list[int], chunk_size: int) -> None:
    """Remove leftover temporary files in this shard's chunk directories (a killed write)."""
    for start in book_starts:
        chunk = out / layout.chunk_dir_name(start, start + chunk_size)
        if chunk.is_dir():
            for path in chunk.iterdir():
                if layout.is_temporary(path.name):
                    path.unlink(missing_ok=True)


class ProgressLine:
    """The run's progress line on a terminal (hsmon/contracts/progress_line.py: the one every long
    command draws): rows, tokens/s measured since the line started, bytes written, ETA, a pause."""

    def __init__(self, progress: Any, name: str = "extract") -> None:
        self.progress = progress
        self.line = progress_line.ProgressLine(name, "rows")
        self.enabled = self.line.enabled
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
        eta = format_duration(left / rate) if rate > 0 else "-"
        state = f" · PAUSED ({snap['paused']})" if snap["paused"] else ""
        self.line.update(snap["rows_done"], snap["rows_total"],
                         f"{rate:,.0f} tok/s · {format_bytes(snap['bytes_done'])} · eta {eta}{state}")

    def end(self) -> None:
        self.line.close()


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
    resumed = (f"; resuming: {len(prep.done)} rows were written by an earlier run, {left} to go"
               if prep.done and (left := len(prep.scan.rows or ()) - len(prep.done)) >= 0 else "")
    log(f"{len(prep.scan.rows or ())} rows, {prep.scan.tokens} tokens -> {prep.out}; {headroom_line(prep)}"
        f"{resumed}")
    return extract(prep, args)


def extract(prep: Prepared, args: argparse.Namespace) -> int:
    """Extract the planned rows through the backend and the writer; returns the exit status.

    One place releases what the run holds (signal handlers, the backend, the event file),
    whichever way it ends.
    """
    prep.out.mkdir(parents=True, exist_ok=True)
    layout.repair_jsonl_tail(prep.manifest_path)
    expected, book, progress = start_books(prep)
    clean_temporaries(prep.out, sorted(expected), prep.chunk_size)
    write_token_counts(prep)
    stop_event = StopRequest()
    events = ev.EventWriter(prep.job, path=events_path(prep, args))
    previous = install_stop_handlers(stop_event)  # a signal during model loading also stops cleanly
    try:
        backend = open_backend(prep, args, events, progress, stop_event)
        if isinstance(backend, int):
            return backend
        try:
            emit_start(prep, events, progress, backend.name, backend.describe(), len(expected))
            return run_rows(prep, args, book, progress, events, backend, stop_event, len(expected))
        finally:
            backend.close()
    finally:
        restore_handlers(previous)
        events.close()


def events_path(prep: Prepared, args: argparse.Namespace) -> str | None:
    """Where the events go: --events; else stdout, unless stdout is a terminal, where they would
    break into the progress line: then OUT/events.jsonl (said once), the path the units use."""
    if args.events or not sys.stdout.isatty():
        return args.events
    path = prep.out / "events.jsonl"
    log(f"events -> {path} (stdout is a terminal; --events FILE to choose, a pipe to read them on stdout)")
    return str(path)


def write_token_counts(prep: Prepared) -> None:
    """The dataset's token counts for a following trainer (extractor/token_counts.py); a failure
    costs that trainer its vocabulary's sample, not the extraction."""
    from extractor.token_counts import write_scan_counts

    try:
        written = write_scan_counts(prep.data, prep.out, prep.shard.as_tuple, prep.scan, prep.tokenizer,
                                    prep.limits)
    except OSError as exc:
        log(f"the dataset's token counts were not written ({exc}); a following trainer takes its "
            "draft vocabulary from the first chunks instead")
        return
    if written is not None:
        log(f"token counts for a following trainer's draft vocabulary -> {written.name}")


def open_backend(prep: Prepared, args: argparse.Namespace, events: ev.EventWriter, progress: Any,
                 stop_event: threading.Event) -> Any:
    """The run's backend, or the exit status when it cannot serve this run (said in one line)."""
    from extractor.backends import create_backend
    from extractor.backends.base import RunContext

    try:
        return create_backend(args.backend, str(prep.model_dir), RunContext(events, progress, stop_event),
                              capture_points=prep.layers, device=prep.device, dtype=prep.dtype,
                              **prep.backend_options)
    except UsageError as exc:  # a server that cannot serve this run (backend sglang's preflight)
        log(str(exc))
        events.emit(ev.ERROR, message=str(exc))
        return 2
    except Exception as exc:
        events.emit(ev.ERROR, message=f"cannot load the model: {exc}")
        log(f"cannot load the model {prep.model_dir}: {exc}")
        return 1


def emit_start(prep: Prepared, events: ev.EventWriter, progress: Any, backend_name: str,
               backend_facts: dict[str, Any], chunks_total: int) -> None:
    """The ``start`` event: the plan, what earlier runs did, and how this run computes."""
    events.emit(ev.START, rows_total=progress.rows_total, tokens_total=progress.tokens_total,
                rows_done=len(prep.done), tokens_done=prep.done_tokens, rejects=progress.rejects,
                rejects_by_reason=dict(progress.rejects_by_reason), chunks_total=chunks_total,
                chunks_done=progress.chunks_done, layers=prep.layers,
                num_layers=prep.num_layers, hidden_size=prep.hidden_size, dtype=prep.dtype,
                out_dir=str(prep.out.resolve()), pid=os.getpid(), backend=backend_name,
                model=str(prep.model_dir), device=prep.device, chunk_size=prep.chunk_size,
                shard=[prep.shard.index, prep.shard.count], bytes_needed=prep.bytes_needed,
                bytes_free=prep.bytes_free, resumed=bool(prep.done or prep.manifest.rejects),
                process_started_ts=ev.process_started(), log=ev.own_log(), **backend_facts)


def run_rows(prep: Prepared, args: argparse.Namespace, book: Any, progress: Any, events: ev.EventWriter,
             backend: Any, stop_event: threading.Event, chunks_total: int) -> int:
    """Record the run's start, compute every row not done, and record how the run ended."""
    from extractor.spool_gate import SpoolGate, record_limit
    from extractor.writer import Abandoned, RowWriter

    started = time.monotonic()
    line = ProgressLine(progress)
    spool_max = record_limit(prep.out, prep.spool_max)
    gate = (None if spool_max is None else
            SpoolGate(prep.out, spool_max, events, progress, stop_event, args.spool_poll, Abandoned,
                      prep.manifest_path.name))
    writer = RowWriter(prep.out, prep.manifest_path, book, prep.layers, events, progress, stop_event,
                       prep.min_free, poll_seconds=args.disk_poll, on_rows=line.update,
                       rejects_path=prep.out / layout.rejects_name(prep.shard.as_tuple),
                       spool_room=gate)
    try:
        # through the writer, so that a disk already full at start pauses instead of failing
        writer.append([{"type": "run", "settings": prep.settings, "pid": os.getpid(), "started": time.time(),
                        "rows_done": len(prep.done), "tokens_done": prep.done_tokens, "job": prep.job,
                        "rows_total": progress.rows_total, "tokens_total": progress.tokens_total,
                        "chunks_total": chunks_total, "rejects": progress.rejects,
                        "bytes_needed": prep.bytes_needed, "captured": backend.captured()}])
        writer.record_scan_rejects(prep.scan.rejects or [], prep.manifest.rejects)
        writer.write_completed_chunks()  # chunks finished by an earlier run just before it died
    except Exception as exc:  # includes a stop requested while paused for disk
        if gate is not None:
            gate.close()
        if stop_event.is_set():
            return end_run(prep, writer, events, progress.snapshot(), 0.0, stopped=True, error=None)
        events.emit(ev.ERROR, message=f"{type(exc).__name__}: {exc}", **progress.snapshot())
        log(f"error: {type(exc).__name__}: {exc}")
        return 1
    from extractor import first_chunk_check

    check = first_chunk_check.start(prep.out, prep.model_dir, backend,
                                    getattr(args, "skip_first_chunk_check", False), stop_event)
    if check is not None:  # the chunks this run completes (not those of an earlier run)
        writer.on_chunk = check.chunk_done
    writer.start()
    quit_heartbeat = threading.Event()
    heartbeat = threading.Thread(target=heartbeat_loop, name="hsmon-heartbeat", daemon=True,
                                 args=(events, progress, args.heartbeat, quit_heartbeat, line.update))
    heartbeat.start()
    error: str | None = None
    try:
        compute_rows(prep, backend, writer, stop_event)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    writer.finish()
    if gate is not None:
        gate.close()
    if check is not None:
        check.finish(stopped=stop_event.is_set())
        error = error or check.error
    quit_heartbeat.set()
    heartbeat.join()
    line.end()
    if writer.error is not None and error is None:
        error = f"writing failed: {type(writer.error).__name__}: {writer.error}"
    seconds = round(time.monotonic() - started, 3)
    return end_run(prep, writer, events, progress.snapshot(), seconds, stop_event.is_set(), error)


def compute_rows(prep: Prepared, backend: Any, writer: Any, stop_event: threading.Event) -> None:
    """Batches of rows not done yet: through the backend, then to the writer, until done or stopped."""
    from extractor.backends.base import BackendStopped, RowRejected
    from extractor.writer import RejectItem, RowItem

    rows, lengths = list(prep.scan.rows or ()), list(prep.scan.lengths or ())
    late = prep.late_rejects  # rows a backend rejected in an earlier run

    def skipped(index: int) -> bool:
        return index in prep.done or index in late

    fetch = RowFetcher(prep.data, prep.tokenizer, prep.limits)
    try:
        for batch in plan_batches(rows, lengths, prep.chunk_size, prep.batch_tokens):
            if stop_event.is_set() or writer.error is not None or writer.abandoned:
                return
            indices = [rows[p] for p in batch]
            if all(skipped(i) for i in indices):
                continue
            got = fetch.rows(indices)
            for row, pos in zip(got, batch, strict=True):
                if len(row.input_ids) != lengths[pos]:
                    raise RuntimeError(f"dataset {prep.data} changed during the run (row {row.index})")
            states = backend.extract([r.input_ids for r in got], rows=indices)
            items: list[RowItem | RejectItem] = [
                RejectItem(r.index, r.line, s.reason, len(r.input_ids)) if isinstance(s, RowRejected)
                else RowItem(r.index, r.input_ids, r.loss_mask, s.hidden_state, s.aux_hidden_state)
                for r, s in zip(got, states, strict=True) if not skipped(r.index)]
            if not writer.submit(items):
                return
    except BackendStopped:
        pass  # a stop requested while the backend waited (server down, dump dir full)


def end_run(prep: Prepared, writer: Any, events: ev.EventWriter, snap: dict[str, Any], seconds: float,
            stopped: bool, error: str | None) -> int:
    """Say and record how the run ended (error, stopped by a signal, or done); the exit status."""
    if error is not None:
        events.emit(ev.ERROR, message=error, **snap)
        log(f"error: {error}")
        return 1
    if snap["rows_done"] < snap["rows_total"]:
        if not stopped:
            events.emit(ev.ERROR, message="the run ended with rows left (writer gave up)", **snap)
            return 1
        signum = getattr(writer.stop_event, "signum", None) or signal.SIGTERM
        name = signal.Signals(signum).name
        writer.record_ending("stopped", snap, seconds)
        resume = f"run the same `hsmon extract` command again: it resumes after row {snap['rows_done']}"
        events.emit(ev.STOPPED, reason="signal", signal=name, seconds=seconds, resume=resume, **snap)
        log(f"stopped ({name}) at {snap['rows_done']}/{snap['rows_total']} rows; run the same command to "
            f"resume (exit status {128 + signum})")
        return 128 + signum  # the shell's convention for a run a signal ended: a wrapper sees no success
    writer.record_ending("done", snap, seconds)
    events.emit(ev.DONE, seconds=seconds, out_dir=str(prep.out.resolve()), **snap)
    why = summary(snap["rejects_by_reason"])
    where = f"; each with its reason in {writer.rejects_path}" if snap["rejects"] else ""
    log(f"done: {snap['rows_done']} rows, {snap['tokens_done']} tokens, "
        f"{format_bytes(snap['bytes_done'])} in {prep.out} ({snap['rejects']} rejected"
        f"{': ' + why if why else ''}{where})")
    return 0


def start_books(prep: Prepared) -> tuple[dict[int, int], Any, Any]:
    """The shard's chunks (first row -> rows expected), the chunk book with what earlier runs did,
    and the counters: rows a backend rejected in an earlier run stay planned (the same batches)
    but count as rejects, not as rows to do."""
    from extractor.writer import ChunkBook, Progress

    scan, late = prep.scan, prep.late_rejects
    rows, lengths, rejects = list(scan.rows or ()), list(scan.lengths or ()), scan.rejects or []
    expected: dict[int, int] = {}
    for index in rows + [r.index for r in rejects]:
        start = layout.chunk_bounds(index, prep.chunk_size)[0]
        expected[start] = expected.get(start, 0) + 1
    book = ChunkBook(prep.chunk_size, expected, recorded=set(prep.manifest.chunks))
    for record in prep.manifest.open_row_records():  # complete chunks have their record already
        if record["row"] in prep.done:
            book.add_row(record)
    for row in late:
        book.add_reject(row)
    chunks_recorded = sum(
        layout.chunk_dir_name(start, start + prep.chunk_size) in prep.manifest.chunks for start in expected
    )
    late_tokens = sum(n for r, n in zip(rows, lengths, strict=True) if r in late)
    progress = Progress(rows_total=len(rows) - len(late), tokens_total=scan.tokens - late_tokens,
                        rows_done=len(prep.done), tokens_done=prep.done_tokens, bytes_done=prep.done_bytes,
                        rejects=len(rejects) + len(late), chunks_done=chunks_recorded,
                        rejects_by_reason=count_by_class([r.reason for r in rejects] + list(late.values())))
    return expected, book, progress


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


class StopRequest(threading.Event):
    """The run's stop flag, with the signal that set it (its exit status is 128 + that number)."""

    signum: int | None = None


def install_stop_handlers(stop_event: StopRequest) -> dict[int, Any]:
    """First SIGTERM/SIGINT/SIGHUP (a lost terminal): stop at the next row boundary. The same
    SIGINT or SIGTERM again (a second Ctrl-C): leave at once. Any other signal after the first is the
    same request: Ctrl-C reaches every process of the terminal's group, and a parent (`hsmon online`,
    a unit) then forwards SIGTERM; a hang-up comes from the kernel and again from the shell; taking
    those for a second request would leave before the run records how it stopped."""

    def handler(signum: int, _frame: Any) -> None:
        if stop_event.is_set():
            if signum == stop_event.signum and signum != signal.SIGHUP:
                os._exit(128 + signum)
            return
        stop_event.signum = signum
        stop_event.set()

    return stop_signals.install(handler)


def restore_handlers(previous: dict[int, Any]) -> None:
    stop_signals.restore(previous)

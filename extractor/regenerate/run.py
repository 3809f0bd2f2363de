"""The regeneration loop: rows fed in source order to the engine's workers, answers drawn turn by
turn, rows committed in order by the writer, progress reported as `hsmon extract` reports it (the
events contract, a heartbeat, the terminal's progress line), and the ending recorded.

Resume rule: the same command goes on after the last row the manifest records (a kill -9 included):
rows finished out of order and not yet committed are generated again, never skipped nor doubled.
"""

from __future__ import annotations

import argparse
import os
import queue
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from extractor import dataset as ds
from extractor.conversations import RowError
from extractor.errors import UsageError, log, program
from extractor.regenerate import turns
from extractor.regenerate.prepare import SEED_RULE, Prepared, dry_run, prepare
from extractor.regenerate.writer import OrderedWriter, Refused, Regenerated, RegenProgress
from extractor.run import (
    ProgressLine,
    StopRequest,
    events_path,
    heartbeat_loop,
    install_stop_handlers,
    restore_handlers,
)
from hsmon import __version__
from hsmon.contracts import events as ev
from hsmon.contracts import layout, nofollow, regen_layout
from hsmon.contracts.rejects import TRUNCATED, summary
from hsmon.contracts.units import format_duration

DRAIN_S = 120.0  # at most, for an in-process answer to end after a stop (one decoding step)
WINDOW_PER_WORKER = 8  # rows fed ahead of the commit, per worker (memory bound; a slow row holds the rest)


def main(args: argparse.Namespace) -> int:
    """Run `hsmon regenerate`; returns the exit status."""
    with program("hsmon regenerate"):
        return _main(args)


def _main(args: argparse.Namespace) -> int:
    try:
        prep = prepare(args)
    except UsageError as exc:
        log(str(exc))
        return 2
    if args.dry_run:
        return dry_run(prep)
    left = prep.scan.rows - prep.totals.rows - max(0, prep.totals.rejects - len(prep.scan.rejects))
    log(f"{prep.scan.rows} rows ({prep.scan.answers} answers) -> {prep.out / regen_layout.DATA_NAME}"
        + (f"; {prep.totals.committed} committed by an earlier run, {max(0, left)} to go"
           if prep.totals.committed else ""))
    return regenerate(prep, args)


def regenerate(prep: Prepared, args: argparse.Namespace) -> int:
    """Open the engine, draw every answer not committed yet, record how the run ended. One place
    releases what the run holds (signal handlers, the engine, the event file)."""
    prep.out.mkdir(parents=True, exist_ok=True)
    for name in (regen_layout.MANIFEST_NAME, regen_layout.REJECTS_NAME):
        layout.repair_jsonl_tail(prep.out / name)
    cut_to_committed(prep.out / regen_layout.DATA_NAME, prep.totals.end)
    stop_event = StopRequest()
    events = ev.EventWriter(prep.job, path=events_path(prep, args))
    previous = install_stop_handlers(stop_event)
    progress = RegenProgress(prep.totals, rows_total=prep.scan.rows - _late_rejects(prep),
                             prior_tokens_per_row=prep.scan.source_tokens / max(1, prep.scan.rows))
    try:
        engine = open_engine(prep, args, events, progress, stop_event)
        if isinstance(engine, int):
            return engine
        try:
            return run_rows(prep, args, engine, events, progress, stop_event)
        finally:
            engine.close()
    finally:
        restore_handlers(previous)
        events.close()


def cut_to_committed(data: Path, end: int) -> None:
    """Cut what a killed run appended to the dataset after its last manifest record (no link
    followed: hsmon/contracts/nofollow.py)."""
    try:
        fd = nofollow.open_file(data, os.O_WRONLY)
    except FileNotFoundError:
        return
    try:
        if os.fstat(fd).st_size > end:
            os.ftruncate(fd, end)
            os.fsync(fd)
    finally:
        os.close(fd)


def _late_rejects(prep: Prepared) -> int:
    """Rows an earlier run rejected while regenerating them (a server's refusal, a cut answer)."""
    scanned = sum(1 for r in prep.scan.rejects if r.index <= prep.totals.last_row)
    return max(0, prep.totals.rejects - scanned)


def open_engine(prep: Prepared, args: argparse.Namespace, events: ev.EventWriter, progress: Any,
                stop_event: threading.Event) -> Any:
    """The run's engine, or the exit status when it cannot serve (said in one line)."""
    from extractor.backends.base import RunContext
    from extractor.backends.hf import model_facts

    max_positions = model_facts(prep.config)[3]
    try:
        if args.backend == "sglang":
            from extractor.backends.sglang.options import build
            from extractor.regenerate.engine_sglang import SGLangEngine

            options = build(args, prep.job, longest_row=1)
            context = RunContext(events, progress, stop_event)
            return SGLangEngine(options, prep.sampling, context, max_positions)
        from extractor.backends.hf import resolve_device, resolve_dtype
        from extractor.regenerate.engines import HFEngine

        device = resolve_device(args.device)
        return HFEngine(prep.model_dir, prep.sampling, device, resolve_dtype(args.dtype, device),
                        getattr(prep.tokenizer, "pad_token_id", None), stop_event)
    except (UsageError, ValueError) as exc:
        log(str(exc))
        events.emit(ev.ERROR, message=str(exc))
        return 2
    except Exception as exc:
        events.emit(ev.ERROR, message=f"cannot load the model: {exc}")
        log(f"cannot load the model {prep.model_dir}: {exc}")
        return 1


def run_record(prep: Prepared, engine: Any, progress: RegenProgress) -> dict[str, Any]:
    """The manifest's ``run`` record: the settings that bind a resume and the answers' provenance."""
    provenance = {"model": str(prep.model_dir), "model_name": prep.model_dir.name, **engine.provenance(),
                  "sampling": prep.sampling.record(), "seed": prep.settings["seed"], "seed_rule": SEED_RULE,
                  "reasoning": prep.settings["reasoning"], "truncated": prep.settings["truncated"],
                  "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "hsmon": __version__}
    snap = progress.snapshot()
    return {"type": "run", "settings": prep.settings, "provenance": provenance, "pid": os.getpid(),
            "started": time.time(), "job": prep.job, "rows_done": snap["rows_done"],
            "rows_total": snap["rows_total"], "source_tokens_total": prep.scan.source_tokens}


def run_rows(prep: Prepared, args: argparse.Namespace, engine: Any, events: ev.EventWriter,
             progress: RegenProgress, stop_event: StopRequest) -> int:
    """Record the run's start, regenerate every row not committed, record how the run ended."""
    from extractor.disk_room import WRITE_MARGIN_BYTES

    started = time.monotonic()
    window = Window(max(WINDOW_PER_WORKER * engine.concurrency, 64))
    writer = OrderedWriter(prep.out, prep.totals.last_row + 1, progress, events, stop_event, prep.min_free,
                           args.disk_poll, on_commit=window.committed)
    record = run_record(prep, engine, progress)
    try:
        writer.room.write(WRITE_MARGIN_BYTES,
                          lambda: layout.append_jsonl(prep.out / regen_layout.MANIFEST_NAME, [record]))
    except Exception as exc:  # a stop while paused for disk, or the disk failing
        if stop_event.is_set():
            return end_run(prep, writer, events, progress, 0.0, stop_event, None)
        log(f"error: {type(exc).__name__}: {exc}")
        return 1
    snap = progress.snapshot()
    events.emit(ev.START, task=regen_layout.TASK, out_dir=str(prep.out.resolve()), pid=os.getpid(),
                backend=engine.name, model=str(prep.model_dir), resumed=bool(prep.totals.committed),
                sampling=prep.sampling.record(), process_started_ts=ev.process_started(), log=ev.own_log(),
                **engine.describe(),
                **snap)
    line = ProgressLine(progress, "regenerate")
    writer.on_rows = line.update
    writer.start()
    quit_heartbeat = threading.Event()
    heartbeat = threading.Thread(target=heartbeat_loop, name="hsmon-heartbeat", daemon=True,
                                 args=(events, progress, args.heartbeat, quit_heartbeat, line.update))
    heartbeat.start()
    workers = Workers(prep, engine, writer, stop_event, window)
    error = workers.run(feed(prep, writer.next_row))
    writer.finish()
    quit_heartbeat.set()
    heartbeat.join()
    line.end()
    error = error or (f"writing failed: {type(writer.error).__name__}: {writer.error}"
                      if writer.error is not None else None)
    return end_run(prep, writer, events, progress, round(time.monotonic() - started, 3), stop_event, error)


def feed(prep: Prepared, start: int) -> Iterator[turns.Source | Refused]:
    """The rows from ``start`` on, in order: each a source to regenerate or a reject with its reason."""
    for index, line_no, raw in ds.iter_lines(prep.data):
        if index < start:
            continue
        try:
            source = turns.parse_source(raw, index)
        except RowError as exc:
            yield Refused(index, line_no, str(exc))
            continue
        source.line = line_no
        yield source


class Window:
    """At most ``size`` rows between the next to commit and the next to feed: the rows waiting ahead
    of a slow one stay few (memory), and a paused writer makes the feeder wait."""

    def __init__(self, size: int) -> None:
        self.size, self.fed, self.done = size, 0, None
        self._cond = threading.Condition()

    def committed(self, next_row: int) -> None:
        with self._cond:
            self.done = next_row
            self._cond.notify_all()

    def wait_for_room(self, row: int, give_up: threading.Event) -> bool:
        """Wait until ``row`` may be fed; False when ``give_up`` is set meanwhile."""
        with self._cond:
            while self.done is not None and row - self.done >= self.size:
                if give_up.is_set():
                    return False
                self._cond.wait(0.2)
            return not give_up.is_set()


class Workers:
    """The engine's workers (its concurrency; daemon threads, so that a stop never waits for an answer
    in flight): each takes a row, draws its answers turn by turn and hands the row to the writer."""

    def __init__(self, prep: Prepared, engine: Any, writer: OrderedWriter, stop_event: threading.Event,
                 window: Window) -> None:
        self.prep, self.engine, self.writer, self.window = prep, engine, writer, window
        self.stop_event = stop_event
        self.halt = threading.Event()  # a stop, or an error: no more rows
        self.error: str | None = None
        self.todo: queue.Queue[turns.Source | None] = queue.Queue(maxsize=2 * engine.concurrency)
        self.tokenizer_lock = threading.Lock()

    def run(self, rows: Iterator[turns.Source | Refused]) -> str | None:
        """Feed every row, wait for the last answers; the error that halted the run, or None."""
        threads = [threading.Thread(target=self._work, name=f"hsmon-regenerate-{i}", daemon=True)
                   for i in range(self.engine.concurrency)]
        for thread in threads:
            thread.start()
        self.window.done = self.writer.next_row
        for item in rows:
            if self.stop_event.is_set() or not self.window.wait_for_room(item.row if isinstance(
                    item, Refused) else item.index, self.halt_or_stop()):
                break
            if isinstance(item, Refused):
                self.writer.put(item)
            else:
                self._queue(item)
        for _ in threads:
            self._queue(None)
        for thread in threads:
            while thread.is_alive() and not self.halt_or_stop().is_set():
                thread.join(0.2)
        if getattr(self.engine, "drains_on_stop", False):
            # in-process: the answer being drawn ends at its next step (the engine's stopping
            # criterion); leaving the process meanwhile would tear torch down under a running thread
            for thread in threads:
                thread.join(DRAIN_S)
        return self.error

    def halt_or_stop(self) -> threading.Event:
        if self.stop_event.is_set():
            self.halt.set()
        return self.halt

    def _queue(self, item: turns.Source | None) -> None:
        while not self.halt_or_stop().is_set():
            try:
                self.todo.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def _work(self) -> None:
        while not self.halt.is_set():
            try:
                source = self.todo.get(timeout=0.2)
            except queue.Empty:
                continue
            if source is None:
                return
            try:
                done = regenerate_row(self.prep, self.engine, source, self.tokenizer_lock)
            except Exception as exc:  # the engine gave up (no server), or refuses everything
                from extractor.backends.base import BackendStopped

                if not isinstance(exc, BackendStopped):
                    self.error = self.error or f"{type(exc).__name__}: {exc}"
                self.halt.set()
                return
            if done is not None and not self.halt.is_set():
                self.writer.put(done)


def regenerate_row(prep: Prepared, engine: Any, source: turns.Source,
                   tokenizer_lock: threading.Lock) -> Regenerated | Refused | None:
    """Every answer of one row, in order, each given the target's own earlier answers; None when a
    stop came meanwhile (the row is dropped: a resume draws it again)."""
    from extractor.backends.base import RowRejected

    tok, sampling, reasoning = prep.tokenizer, prep.sampling, prep.settings["reasoning"]
    history: list[dict[str, str]] = []
    messages: list[dict[str, Any]] = []
    record: list[dict[str, Any]] = []
    for place in range(len(source.messages) + 1):
        if place not in source.answer_at:
            if place < len(source.messages):
                history.append(source.messages[place])
                messages.append(dict(source.messages[place]))
            continue
        with tokenizer_lock:
            prompt = turns.render_prompt(history, tok, prep.template_kwargs)
            source_tokens = turns.source_tokens(source, place, tok)
        if len(prompt) + sampling.max_new_tokens > engine.max_positions:
            why = (f"too long: answer {len(record) + 1}'s prompt of {len(prompt)} tokens + --max-new-tokens "
                   f"{sampling.max_new_tokens} > the target's {engine.max_positions} positions")
            return Refused(source.index, source.line, why, late=True)
        answer = engine.generate(prompt, turns.turn_seed(prep.settings["seed"], source.row_id, place),
                                 source.index)
        if answer is None:
            return None
        if isinstance(answer, RowRejected):
            return Refused(source.index, source.line, answer.reason, late=True)
        if answer.finish == "length" and prep.settings["truncated"] == "reject":
            why = f"{TRUNCATED} {sampling.max_new_tokens} (answer {len(record) + 1}; --truncated reject)"
            return Refused(source.index, source.line, why, late=True)
        content = answer.content_ids(sampling.stop_ids)
        with tokenizer_lock:
            text = tok.decode(content, skip_special_tokens=True)
        thinking, text = turns.split_reasoning(text)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if thinking is not None and reasoning == "save":
            message["reasoning_content"] = thinking
        messages.append(message)
        history.append({"role": "assistant", "content": text})
        record.append({"finish": answer.finish, "tokens": len(content), "source_tokens": source_tokens,
                       "prompt_tokens": len(prompt)})
    return Regenerated(source.index, source.line, turns.output_row(source, messages), record)


def end_run(prep: Prepared, writer: OrderedWriter, events: ev.EventWriter, progress: RegenProgress,
            seconds: float, stop_event: StopRequest, error: str | None) -> int:
    """Say and record how the run ended (error, stopped by a signal, or done); the exit status."""
    snap = progress.snapshot()
    snap.pop("paused")
    if error is not None:
        events.emit(ev.ERROR, message=error, **snap)
        log(f"error: {error}; run the same command to resume after row {writer.next_row - 1}")
        return 1
    if writer.next_row < prep.scan.lines:
        if not stop_event.is_set():
            events.emit(ev.ERROR, message="the run ended with rows left (the writer gave up)", **snap)
            return 1
        signum = stop_event.signum or signal.SIGTERM
        name = signal.Signals(signum).name
        writer.record_ending("stopped", seconds)
        resume = f"run the same `hsmon regenerate` command again: it resumes at row {writer.next_row}"
        events.emit(ev.STOPPED, reason="signal", signal=name, seconds=seconds, resume=resume, **snap)
        log(f"stopped ({name}) at {snap['rows_done']}/{snap['rows_total']} rows; run the same command to "
            f"resume (exit status {128 + signum})")
        return 128 + signum
    writer.record_ending("done", seconds)
    events.emit(ev.DONE, seconds=seconds, out_dir=str(prep.out.resolve()), **snap)
    log(done_line(prep, progress, seconds))
    return 0


def done_line(prep: Prepared, progress: RegenProgress, seconds: float) -> str:
    """'done: 40 rows, 960 tokens (mean answer 24.0 tokens, the source's 51.3), 40 cut at
    --max-new-tokens, 1 rejected: ... in 1m05s -> OUT/regenerated.jsonl'."""
    t = progress.totals
    mean, source = t.mean_answer_tokens(), t.mean_source_tokens()
    means = f" (mean answer {mean:.1f} tokens, the source's {source:.1f})" if mean is not None and source \
        else ""
    why = summary(t.reject_classes)
    return (f"done: {t.rows} rows, {t.answer_tokens} tokens{means}, {t.truncated_rows} cut at "
            f"--max-new-tokens, {t.rejects} rejected{': ' + why if why else ''} in "
            f"{format_duration(seconds)} -> {prep.out / regen_layout.DATA_NAME}")

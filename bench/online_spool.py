"""bench/online.py's spool checks: the peak bytes of row files, what the ledger says of every row's
passes, and an online run with one kill -9 of each side."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path
from typing import Any

from bench.online_procs import hsmon, start, wait_for, wait_ok
from hsmon.contracts import events as ev
from hsmon.contracts import layout, spool
from hsmon.contracts.manifest_reader import read_manifest

CHUNK = 25  # rows a chunk of the fault run (and of the offline extraction)

class SpoolWatch:
    """The peak bytes of row files in a spool, sampled every 0.1 s in a thread."""

    def __init__(self, path: Path) -> None:
        self.path, self.peak = path, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _bytes(self) -> int:
        total = 0
        try:
            for chunk in os.scandir(self.path):
                if chunk.is_dir() and chunk.name.startswith("rows_"):
                    for entry in os.scandir(chunk.path):
                        with contextlib.suppress(OSError):  # deleted meanwhile
                            total += entry.stat().st_size
        except OSError:
            return 0
        return total

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, self._bytes())

    def close(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def fed_env(spool_dir: Path) -> dict[str, str]:
    """The trainer's environment addition: log the rows each taken step fed (trainer/fed_rows.py)."""
    from trainer.fed_rows import FED_ROWS_ENV

    return {FED_ROWS_ENV: str(spool_dir.parent / f"{spool_dir.name}-fed-rows")}


def pass_errors(spool_dir: Path, passes: int) -> tuple[int, int, int]:
    """(rows with fewer passes than E, rows with more, training rows), counted from the batches the
    model was really fed (the trainer's fed-rows log: steps that updated the weights and survived),
    not from the trainer's own ledger."""
    from trainer.fed_rows import FED_ROWS_ENV, read_fed_rows
    from trainer.window import HeldOut

    first = next(r for r in layout.iter_jsonl(spool.ledger_path(spool_dir)) if r.get("type") == "start")
    rule = HeldOut.from_record(first["heldout"])
    fed = read_fed_rows(fed_env(spool_dir)[FED_ROWS_ENV])
    rows = [r for r in read_manifest(spool_dir).rows if not rule.holds(r)]
    lost = sum(1 for r in rows if fed.get(r, 0) < passes)
    extra = sum(1 for r in rows if fed.get(r, 0) > passes)
    return lost, extra, len(rows)


def heldout_bytes(spool_dir: Path) -> tuple[int, int]:
    """(rows, bytes) of the held-out rows (the ledger's rule): never consumed, they keep their room
    in the spool for the whole run."""
    from hsmon.contracts.manifest_reader import read_row_records
    from trainer.window import HeldOut

    first = next(r for r in layout.iter_jsonl(spool.ledger_path(spool_dir)) if r.get("type") == "start")
    rule = HeldOut.from_record(first["heldout"])
    held = [int(rec.get("bytes") or 0) for row, rec in read_row_records(spool_dir).items() if rule.holds(row)]
    return len(held), sum(held)


def faults(
    base: Path, data: Path, setup: dict[str, Any], passes: int, train_args: list[str]
) -> tuple[int, int, int]:
    """An online run with one kill -9 of each side, each resumed; (lost, extra, rows) per the batches."""
    sp, out = base / "fault-spool", base / "fault-drafter"
    extract = hsmon(
        "extract",
        str(data),
        "--out",
        str(sp),
        "--model",
        setup["model"],
        "--chunk-size",
        str(CHUNK),
        "--threads",
        "1",
        "--min-free",
        "10M",
        "--events",
        str(base / "fault-ext.jsonl"),
    )
    train = hsmon(
        "train",
        str(sp),
        "--follow",
        "--passes",
        str(passes),
        "--consume",
        "--out",
        str(out),
        "--target-model",
        setup["model"],
        *train_args,
        "--checkpoint-every",
        "3",
    )
    ext = start(extract, base / "fault-extract.log")
    trainer = start(train, base / "fault-train.log", env=fed_env(sp))
    ext_events, events = base / "fault-ext.jsonl", spool.train_events_path(sp)

    def chunks() -> int:
        return (
            sum(1 for e in ev.iter_events(ext_events) if e["kind"] == "chunk") if ext_events.exists() else 0
        )

    wait_for(lambda: ext.poll() is not None or chunks() >= 2)
    killed = ext.poll() is None
    if killed:
        ext.send_signal(signal.SIGKILL)
        ext.wait()
    wait_for(lambda: events.exists() and any(e["kind"] == "checkpoint" for e in ev.iter_events(events)))
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()
    ext = start(extract, base / "fault-extract.log")
    trainer = start([*train, "--resume"], base / "fault-train.log", env=fed_env(sp))
    wait_ok(ext, "the resumed extraction")
    wait_ok(trainer, "the resumed trainer")
    print(
        f"faults: trainer killed -9 after its first checkpoint, extractor killed -9 "
        f"{'after two chunks' if killed else '(it had ended already)'}; both resumed",
        flush=True,
    )
    return pass_errors(sp, passes)

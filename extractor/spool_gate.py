"""`hsmon extract --spool-max SIZE`: the output directory is a spool that a following trainer
consumes (the spool contract, hsmon.contracts.spool).

At start the limit is recorded in SPOOL/hsmon-spool.json (a resume may change it; a resume without
--spool-max keeps the recorded one). Before each row file the writer asks `SpoolGate.wait_for_room`:
when the bytes of rows not yet consumed (every manifest's row bytes minus the ledger's consumed
bytes, read incrementally by hsmon.contracts.spool_fill) plus the row would exceed the limit, the
writer pauses with reason ``spool`` (hsmon/contracts/pauses.py, the same protocol as a full disk) and
checks again every --spool-poll seconds (0.1: the trainer frees room at its step pace;
a 2 s poll left a following trainer starved of rows while the extractor slept) until the
trainer's ledger records consumption. A row is always written into an empty spool, so a row
larger than the limit cannot stop the run. The room is claimed under a lock shared with the other
shards that write the spool (hsmon.contracts.spool_fill.SpoolClaims), so together they never
overshoot the limit; the limit's own check is extractor/spool_limit.py.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from extractor.errors import UsageError, log
from hsmon.contracts import spool
from hsmon.contracts.pauses import Pause
from hsmon.contracts.spool_fill import SpoolClaims, SpoolFill
from hsmon.contracts.units import format_bytes, parse_size


def spool_max_of(args: argparse.Namespace) -> int | None:
    """--spool-max in bytes (None: not given); raises UsageError naming the option."""
    text = getattr(args, "spool_max", None)
    if text is None:
        return None
    try:
        value = parse_size(text)
    except ValueError as exc:
        raise UsageError(f"--spool-max: {exc}") from None
    if value < 1:
        raise UsageError(f"--spool-max {text}: give a size above zero, such as 20GB")
    return value


def record_limit(out: Path, given: int | None) -> int | None:
    """Write the limit given (a resume may change it); without one, keep the directory's recorded
    limit (a spool stays bounded). Returns the limit in force, or None for no spool."""
    recorded = spool.read_spool_limit(out)
    if given is None:
        if recorded is not None:
            log(f"{out} is a spool (limit {format_bytes(recorded)} in {spool.SPOOL_NAME}): "
                "keeping that limit; give --spool-max to change it")
        return recorded
    if recorded != given:
        spool.write_spool_limit(out, given)
    return given


class SpoolGate:
    """Holds the writer while the spool has no room for the next row (pause reason ``spool``)."""

    def __init__(self, out: Path, max_bytes: int, events: Any, progress: Any, stop_event: threading.Event,
                 poll_seconds: float, abandon: Callable[[], BaseException], manifest_name: str) -> None:
        self.out, self.max_bytes, self.poll_seconds = out, max_bytes, poll_seconds
        self.stop_event, self.abandon = stop_event, abandon
        self.fill = SpoolFill(out)
        self.claims = SpoolClaims(out, manifest_name)
        self.pause = Pause(spool.PAUSE_SPOOL, events, progress)
        self.pauses = 0

    def wait_for_room(self, need: int) -> None:
        """Return once ``need`` more bytes (this batch's rows not yet in the manifest, the next one
        included) fit below the limit, with the other shards' claims counted (or the spool is
        empty), and claim them; raises what ``abandon`` makes when a stop is requested while it waits."""
        while True:
            with self.claims.locked():
                claimed = self.claims.others()
                level = self.fill.poll(limit_bytes=self.max_bytes, claimed=claimed,
                                       manifests=self.claims.writers)
                room = level.room_for(need)
                if room:
                    self.claims.set(need)
            waiting = level.waiting_bytes
            if room:
                self.pause.end(f"{format_bytes(waiting)} of rows waiting in {self.out}, limit "
                               f"{format_bytes(self.max_bytes)}", spool_bytes=waiting,
                               max_bytes=self.max_bytes)
                return
            message = f"spool full: {format_bytes(waiting)} of rows waiting for the trainer"
            if self.pause.begin(
                f"{message} (limit {format_bytes(self.max_bytes)}, the next row needs {format_bytes(need)})",
                "the trainer to consume rows (its ledger, hsmon-ledger.jsonl; stop with SIGTERM)",
                self.poll_seconds, message=message, spool_bytes=waiting, max_bytes=self.max_bytes,
                need_bytes=need, consumed_bytes=level.consumed_bytes, path=str(self.out)):
                self.pauses += 1
            if self.stop_event.is_set():
                raise self.abandon()
            time.sleep(self.poll_seconds)

    def recorded(self) -> None:
        """The claimed rows are in the manifest now: the claim is void."""
        with self.claims.locked():
            self.claims.set(0)

    def close(self) -> None:
        """The run's writer is done: no claim left, the files closed."""
        self.recorded()
        self.claims.close()

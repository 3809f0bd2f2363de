"""An online job's section (``jobs[].online``): an extraction writing a spool (`hsmon extract
--spool-max`) and the trainer following it (`hsmon train --follow`), seen together
(hsmon/core/trackers/online.py measures, hsmon/core/state_online.py decides)."""

from __future__ import annotations

from typing import Any

from msgspec import UNSET

from hsmon.status_doc.base import Num, Section
from hsmon.status_doc.training import TrainingSection

# A side's states: the extractor (producer) or the following trainer (consumer).
#   running   it moves                    paused    the extractor waits for spool room (not stalled)
#   waiting   the trainer waits for rows  starting  not seen yet
#   stalled   alive, nothing moved for stall_after (and not waiting)
#   dead      its process is gone without a done/stopped   done      it did all its work
#   stopped   it ended on request or by a signal before its work was done
SIDE_STATES = ("starting", "running", "paused", "waiting", "stalled", "dead", "done", "stopped")


class OnlineSide(Section):
    """One side of an online job."""

    role: str  # extractor | trainer
    state: str  # one of SIDE_STATES
    reason: str
    rows_per_s: Num | None  # extractor: rows written per second; trainer: rows consumed per second
    pid: int | None = None
    wait_frac: Num | None = None  # share of the window it waited (extractor: spool room; trainer: rows)
    eta_s: Num | None = None  # its own ETA (extractor: rows left; trainer: steps left at its step rate)


class OnlineSection(Section):
    """The spool and both sides. ``spool_bytes``: bytes of rows written and not yet consumed;
    ``rows_waiting``: rows written and not yet consumed; ``window_s``: the span the wait shares
    cover (up to 10 min)."""

    path: str
    limit_bytes: int | None
    spool_bytes: int
    rows_written: int
    rows_consumed: int
    rows_waiting: int
    passes: int | None
    consume: bool
    trainer_step: int | None
    producer: OnlineSide
    consumer: OnlineSide
    bottleneck: str
    window_s: Num = 0
    trainer_arch: str | None = None  # the following trainer's drafter architecture (eagle3, eagle3.1)
    # the following trainer's figures (step, loss, acc, lr, ...), as a training job's ``training``
    training: TrainingSection | None = None


def online_of(job: Any) -> OnlineSection | None:
    """A job's online section, or None when it is no online job (the field is omitted then)."""
    section = getattr(job, "online", UNSET)
    return None if section is UNSET else section

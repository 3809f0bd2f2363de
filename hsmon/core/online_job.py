"""An online job's figures that come from both sides (hsmon/core/state_online.py decides its state):
its ETA is the slower side's, and its processes are both sides' (the extraction's, then the
trainer's that follows its spool, when it runs on this host).
"""

from __future__ import annotations

import msgspec

from hsmon.core.state_online import OnlineFacts
from hsmon.status_doc import Progress
from hsmon.status_doc.job import ProcessEntry
from hsmon.status_doc.online import OnlineSection


def slower_eta(progress: Progress | None, online: OnlineSection | None) -> Progress | None:
    """``progress`` with the ETA of the side that ends last: the job is not done before its trainer
    has given every row its passes (the extraction's rows-left ETA says nothing of a trainer that
    is the bottleneck). Unchanged while the trainer's ETA is not known or is the shorter."""
    if progress is None or online is None:
        return progress
    train = online.consumer.eta_s
    if train is None or (progress.eta_s is not None and progress.eta_s >= train):
        return progress
    low = max(train, progress.eta_low_s) if progress.eta_low_s is not None else None
    high = max(train, progress.eta_high_s) if progress.eta_high_s is not None else None
    return msgspec.structs.replace(progress, eta_s=train, eta_low_s=low, eta_high_s=high)


def both_sides(procs: list[ProcessEntry], facts: OnlineFacts | None) -> list[ProcessEntry]:
    """The job's processes with the trainer's after the extraction's (once, by PID)."""
    trainer = facts.trainer_process if facts is not None else None
    if trainer is None or any(p.pid == trainer.pid for p in procs):
        return procs
    return [*procs, trainer]

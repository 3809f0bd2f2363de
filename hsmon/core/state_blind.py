"""Blind is a state: a tracker failing call after call (hsmon/core/tracker_errors.py ``blind``) leaves
its last figures standing, so what it feeds is not known.

A blind tracker whose figures the verdict stands on (``VERDICT_TRACKERS``: the processes, the
events, the dump and output directories) makes the job's state ``unknown``: the reason says which
tracker is blind, since when, after how many failures and with what error, and what the last
verdict was (never a stale ``alive``/``running``). Any blind tracker adds the warning hint
``tracker-blind``. The job's ``blind`` list (status document) names them for every reader; the
exporter's ``hsmon_tracker_blind_since_timestamp_seconds`` feeds the HsmonTrackerBlind alert.

A call that never returns raises nothing: one tick thread measures every job, so a read blocked on a
hung mount freezes every job's figures at their last tick. ``stale_status`` judges the figures' age
when the status is read: older than ``stale_after`` (many ticks), the job reads ``unknown`` the same
way, with the call the tick is stuck in, and a ``blind`` entry whose ``stale`` names every section.
"""

from __future__ import annotations

import time

from msgspec.structs import replace

from hsmon.core.state_facts import Decision, Hint
from hsmon.core.tracker_errors import Blind, CallInProgress
from hsmon.status_doc.job import BlindTracker, JobStatus

VERDICT_TRACKERS = frozenset({"processes", "progress", "dump_dir", "output_dir"})
# the job's sections each tracker feeds (marked stale while it is blind)
FEEDS = {"processes": ["processes"], "progress": ["progress", "events", "training"], "dump_dir": ["dump"],
         "output_dir": ["output"], "disk": ["disk"], "server": ["servers"]}
# Figures older than this read unknown: about 30 missed ticks (a tick runs every second; one that
# takes a few seconds on a loaded machine stays far below it).
STALE_AFTER_S = 30.0
# what a tick measures: all of it is stale when no tick has completed for the job
TICK_SECTIONS = ["processes", "progress", "events", "training", "dump", "output", "disk", "servers", "online"]


def describe(blind: Blind) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(blind.since_ts))
    return (f"the {blind.tracker} tracker is blind since {since} "
            f"({blind.failures} failures in a row: {blind.error})")


def blind_decision(decision: Decision, blind: list[Blind]) -> Decision:
    """The decision with what the blind trackers leave unknown: ``unknown`` when the verdict stood on
    one of them, a ``tracker-blind`` warning hint in any case."""
    if not blind:
        return decision
    said = "; ".join(describe(b) for b in blind)
    hints = [*decision.hints, Hint("tracker-blind", "warning",
                                   f"{said}: its figures are stale; see the daemon's log for the traceback "
                                   "(docs/operations.md, HsmonTrackerBlind)")]  # fmt: skip
    if not any(b.tracker in VERDICT_TRACKERS for b in blind):
        return Decision(decision.state, decision.reason, hints, decision.online)
    return Decision("unknown", f"{said}; last verdict before: {decision.state}, {decision.reason}", hints,
                    decision.online)


def blind_entries(blind: list[Blind]) -> list[BlindTracker]:
    """The job's ``blind`` list of the status document."""
    return [BlindTracker(tracker=b.tracker, since_ts=b.since_ts, failures=b.failures, error=b.error,
                         stale=FEEDS.get(b.tracker, [])) for b in blind]  # fmt: skip


def _clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


def stale_status(doc: JobStatus, now: float, measured_ts: float | None, stale_after: float,
                 stuck: CallInProgress | None) -> JobStatus:
    """The job's status as read at ``now``: unchanged while its last tick (``measured_ts``) is recent
    or its verdict is final (done or stopped); else ``unknown``, saying how old the figures are and which call
    the tick is stuck in, with every section marked stale."""
    if measured_ts is None or now - measured_ts <= stale_after or doc.state in ("done", "stopped"):
        return doc
    age = now - measured_ts
    where = (f"stuck in the {stuck.tracker} tracker's {stuck.phase or 'call'} since {_clock(stuck.since_ts)}"
             if stuck is not None else "not running")  # fmt: skip
    said = (f"no fresh figures for {age:.0f} s (last measured at {_clock(measured_ts)}; the monitor's tick "
            f"is {where})")
    hint = Hint("tracker-blind", "warning", f"{said}: every figure of this job is stale; see the daemon's "
                "log and docs/operations.md, HsmonTrackerBlind")  # fmt: skip
    entry = BlindTracker(tracker=stuck.tracker if stuck is not None else "monitor", since_ts=measured_ts,
                         failures=0, error=said, stale=list(TICK_SECTIONS))
    blind = [b for b in doc.blind or [] if b.tracker != entry.tracker]
    return replace(doc, state="unknown", state_since_ts=measured_ts,
                       reason=f"{said}; last verdict before: {doc.state}, {doc.reason}",
                       hints=[*doc.hints, hint], blind=[entry, *blind])

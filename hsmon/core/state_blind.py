"""Blind is a state: a tracker failing call after call (hsmon/core/tracker_errors.py ``blind``) leaves
its last figures standing, so what it feeds is not known.

A blind tracker whose figures the verdict stands on (``VERDICT_TRACKERS``: the processes, the
events, the dump and output directories) makes the job's state ``unknown``: the reason says which
tracker is blind, since when, after how many failures and with what error, and what the last
verdict was (never a stale ``alive``/``running``). Any blind tracker adds the warning hint
``tracker-blind``. The job's ``blind`` list (status document) names them for every reader; the
exporter's ``hsmon_tracker_blind_since_timestamp_seconds`` feeds the HsmonTrackerBlind alert.
"""

from __future__ import annotations

import time

from hsmon.core.state_facts import Decision, Hint
from hsmon.core.tracker_errors import Blind
from hsmon.status_doc.job import BlindTracker

VERDICT_TRACKERS = frozenset({"processes", "progress", "dump_dir", "output_dir"})
# the job's sections each tracker feeds (marked stale while it is blind)
FEEDS = {"processes": ["processes"], "progress": ["progress", "events", "training"], "dump_dir": ["dump"],
         "output_dir": ["output"], "disk": ["disk"], "server": ["servers"]}


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

"""Reloading the daemon's configuration without a restart (SIGHUP, `systemctl reload`).

A pure plan from the jobs watched and the jobs the configuration now names, then its application:
added jobs start, removed ones retire (their last status and series stay for a grace period),
changed ones restart, unchanged ones keep their state, clocks and history. Jobs the daemon
launched itself (trainings through the API) are not the configuration's: a reload leaves them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hsmon.core.config import JobConfig

DEFAULT_RETIRE_GRACE_S = 900.0


@dataclass
class ReloadPlan:
    add: list[JobConfig] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)
    change: list[JobConfig] = field(default_factory=list)
    keep: list[str] = field(default_factory=list)

    def summary(self) -> str:
        parts = [f"{word} {', '.join(names)}" for word, names in (
            ("added", [c.name for c in self.add]), ("removed", self.remove),
            ("changed", [c.name for c in self.change]), ("kept", self.keep)) if names]
        return "; ".join(parts) or "no jobs"


def plan_reload(current: dict[str, JobConfig], wanted: list[JobConfig]) -> ReloadPlan:
    """What a reload does to the configured jobs ``current`` (name -> config) to reach ``wanted``."""
    plan = ReloadPlan()
    names = {cfg.name for cfg in wanted}
    for cfg in wanted:
        old = current.get(cfg.name)
        if old is None:
            plan.add.append(cfg)
        elif old == cfg:
            plan.keep.append(cfg.name)
        else:
            plan.change.append(cfg)
    plan.remove = [name for name in current if name not in names]
    return plan


def apply_reload(monitor: Any, plan: ReloadPlan, grace_s: float) -> None:
    """Carry the plan out on a running Monitor."""
    for name in plan.remove:
        monitor.retire_job(name, grace_s)
    for cfg in plan.change:
        monitor.remove_job(cfg.name)
        monitor.add_job(cfg)
    for cfg in plan.add:
        monitor.add_job(cfg)


def finished_launched(statuses: list[Any], configured: set[str], watched: set[str], now: float,
                      grace_s: float) -> list[str]:
    """Jobs the daemon launched itself (watched, not in its configuration) that ended (done, stopped or dead)
    more than ``grace_s`` ago: their time to be read is over. A job a reload removed is no longer
    watched (its last status stays for its own grace): it is not one of them."""
    return [s.job for s in statuses if s.job in watched and s.job not in configured
            and s.state in ("done", "stopped", "dead") and s.state_since_ts is not None
            and now - s.state_since_ts >= grace_s]

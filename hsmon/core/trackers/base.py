"""The one interface every tracker answers to.

A tracker polls on its own schedule (``due``/``poll``), answers its typed section of the status
document (``section``), and keeps its Prometheus families beside it: a module-level
``metrics(jobs, monitor)`` function that the exporter calls from the list
``TRACKER_METRICS`` (hsmon/core/job_trackers.py). The job's trackers are created from a list
(hsmon/core/job_trackers.py ``JOB_TRACKERS``); ``poll_all`` polls them, each call guarded, so one
tracker's exception is counted (``hsmon_tracker_errors_total{tracker}``), logged once per kind,
and leaves the other trackers, and every other job, running.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

from hsmon.core.tracker_errors import TrackerErrors


@runtime_checkable
class Tracker(Protocol):
    """One thing watched for one job."""

    name: str  # the ``tracker`` label of hsmon_tracker_errors_total

    def due(self, now: float) -> bool:
        """Whether ``poll`` should run this tick (the tracker's own schedule)."""
        ...

    def poll(self, now: float) -> None:
        """Measure (the only I/O)."""
        ...

    def section(self, now: float) -> Any:
        """The tracker's section of the job's status document, from what it measured."""
        ...


# jobs (hsmon.status_doc.JobStatus), the Monitor -> Prometheus metric families
MetricsHook = Callable[[Sequence[Any], Any], Iterable[Any]]


def poll_all(trackers: Sequence[Tracker], errors: TrackerErrors, job: str, now: float) -> None:
    """Poll each due tracker; an exception is counted and logged once per kind, the rest run on."""
    for tracker in trackers:
        if errors.guard(tracker.name, lambda t=tracker: t.due(now), False, job, "due"):
            errors.guard(tracker.name, lambda t=tracker: t.poll(now), None, job, "poll")


def sections(trackers: Sequence[Tracker], errors: TrackerErrors, job: str, now: float,
             last: dict[str, Any]) -> dict[str, Any]:
    """Each tracker's section by name; a tracker that raises keeps its last section (in ``last``)."""
    for tracker in trackers:
        last[tracker.name] = errors.guard(tracker.name, lambda t=tracker: t.section(now),
                                          last.get(tracker.name), job, "section")
    return {t.name: last.get(t.name) for t in trackers}

"""Launch a drafter training and watch it as a monitor job: the one path for the daemon's
``POST /api/v1/train`` and the TUI's in-process launch form.

    outcome = launch_and_watch(monitor, form_fields)   # validate, launch, add the watching job
    pid, error = stop_watched(monitor, job_name)        # SIGTERM to the job's live process
"""

from __future__ import annotations

import hashlib
import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hsmon.core.config import JobConfig
from hsmon.launch import training as launch
from hsmon.launch.paths import PathRefused, PathRule

if TYPE_CHECKING:
    from hsmon.core.monitor import Monitor

TRAIN_STALL_AFTER_S = 600.0


@dataclass
class LaunchOutcome:
    """What a launch did: ``job`` when it started; else ``errors`` (field -> one line) or
    ``conflict`` (a training into that directory is already running)."""

    job: launch.LaunchedJob | None = None
    errors: dict[str, str] = field(default_factory=dict)
    conflict: str | None = None
    warning: str | None = None


def job_config_for(launched: launch.LaunchedJob, events_from: int = 0) -> JobConfig:
    """The monitor job that watches a launched training (its events file from ``events_from`` on:
    the runs launched before into the same directory wrote what comes before, and PID)."""
    return JobConfig(name=launched.job, kind="train", events=launched.events, pid=launched.pid,
                     role="trainer", stall_after=TRAIN_STALL_AFTER_S, events_from=events_from)


def events_size(path: str) -> int:
    """How much an events file already holds (0 when it does not exist yet)."""
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


class Launches:
    """The trainings launched into one monitor: the lock that makes "is one running?" and the launch one
    step, and which output directory each job name stands for (names stay unique per path)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.out_dirs: dict[str, str] = {}

    def name_for(self, monitor: Monitor, request: launch.TrainingRequest) -> str:
        """train-BASENAME, or train-BASENAME-HASH when that name stands for another directory (another
        launch's, or a configured job's): one path, one name, whatever the order of launches."""
        base = request.job_name
        owner = self.out_dirs.get(base)
        if owner == request.out_dir or (owner is None and base not in monitor.job_names()):
            return base
        return f"{base}-{hashlib.sha256(request.out_dir.encode()).hexdigest()[:6]}"


_launches: weakref.WeakKeyDictionary[Any, Launches] = weakref.WeakKeyDictionary()
_launches_lock = threading.Lock()


def launches_of(monitor: Monitor) -> Launches:
    with _launches_lock:
        return _launches.setdefault(monitor, Launches())


def launch_and_watch(monitor: Monitor, fields: dict[str, Any], rule: PathRule | None = None) -> LaunchOutcome:
    """Validate the form (its paths by ``rule``: hsmon/launch/paths.py), launch the training
    detached and add a job that watches it, all under the monitor's launch lock: of two launches
    into one directory at once, the second finds the first running (``conflict``). A finished job
    of the same name is replaced. A path that left the roots between the check and the launch is an
    error of its field; any other OSError from the launch itself propagates."""
    request, errors = launch.validate_training_request(fields, rule)
    if request is None:
        return LaunchOutcome(errors=dict(errors))
    launches = launches_of(monitor)
    with launches.lock:
        name = request.job = launches.name_for(monitor, request)
        if name in monitor.job_names():
            if monitor.job_pid(name) is not None:
                return LaunchOutcome(conflict=f"a training into {request.out_dir} is already running")
            monitor.remove_job(name)
        # a following trainer takes the chunks as they complete: no warning about unfinished ones
        warning = None if request.follow else launch.complete_chunks_warning(request.data_dir)
        earlier = events_size(request.events_path)  # a run launched before into the same directory
        try:
            launched = launch.launch_training(request)
        except PathRefused as exc:
            return LaunchOutcome(errors={exc.field: exc.message})
        launches.out_dirs[name] = request.out_dir
        monitor.add_job(job_config_for(launched, earlier))
    return LaunchOutcome(job=launched, warning=warning)


def stop_watched(monitor: Monitor, name: str) -> tuple[int | None, str | None]:
    """SIGTERM to the live process of job ``name`` (the trainer writes a checkpoint, then exits):
    its PID, or None and why not."""
    if name not in monitor.job_names():
        return None, f"no job named {name!r}; jobs: {', '.join(monitor.job_names())}"
    pid = monitor.job_pid(name)
    if pid is None or not launch.stop_job(pid):
        return None, f"job {name} has no live process to stop"
    return pid, None

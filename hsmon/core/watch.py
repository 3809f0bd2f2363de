"""watchdog glue: filesystem events into a DumpDirTracker (events are hints; scans are truth), a job's
watch (re)scheduled as its dump directory comes and goes, an inotify overflow turned into a scan."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)

from hsmon.core.trackers.dump_dir import DumpDirTracker

if TYPE_CHECKING:
    from hsmon.core.job_runtime import JobRuntime

log = logging.getLogger("hsmon.monitor")


class DumpDirHandler(FileSystemEventHandler):
    # No modified events: a writer makes many per file; the close event carries the final size.
    EVENT_TYPES: ClassVar[list[type[FileSystemEvent]]] = [
        FileCreatedEvent,
        FileDeletedEvent,
        FileMovedEvent,
        FileClosedEvent,
        DirCreatedEvent,
        DirDeletedEvent,
        DirMovedEvent,
    ]

    def __init__(self, tracker: DumpDirTracker) -> None:
        self.tracker = tracker

    def dispatch(self, event: FileSystemEvent) -> None:
        kind = event.event_type
        if kind == "created":
            self.tracker.on_created(event.src_path)
        elif kind == "deleted":
            if event.is_directory and event.src_path == self.tracker.path:
                self.tracker.forget_watch_identity()
            self.tracker.on_deleted(event.src_path)
        elif kind == "moved":
            self.tracker.on_deleted(event.src_path)
            self.tracker.on_changed(event.dest_path)
        elif kind == "closed":
            self.tracker.on_changed(event.src_path)


class OverflowHandler(logging.Handler):
    """watchdog 7.1 only logs an inotify queue overflow: turn that log record into a scan."""

    def __init__(self, on_overflow: Callable[[], None]) -> None:
        super().__init__(logging.WARNING)
        self._on_overflow = on_overflow

    def emit(self, record: logging.LogRecord) -> None:
        if "overflow" in record.getMessage().lower():
            self._on_overflow()


def ensure_watch(observer: Any, runtime: JobRuntime) -> None:
    """(Re)schedule the job's inotify watch when its dump directory appears or is recreated."""
    tracker = runtime.dump
    assert tracker is not None
    if not tracker.exists or tracker.error:
        if runtime.watch is not None:
            unschedule(observer, runtime)
        return
    if runtime.watch is not None and runtime.watch_inode == tracker.dir_inode:
        return
    unschedule(observer, runtime)
    try:
        runtime.watch = observer.schedule(
            DumpDirHandler(tracker),
            tracker.path,
            recursive=False,
            event_filter=DumpDirHandler.EVENT_TYPES,
        )
        runtime.watch_inode = tracker.dir_inode
    except OSError as exc:
        log.warning("cannot watch %s: %s (scans still run)", tracker.path, exc)
        runtime.watch = None
        return
    tracker.scan()  # files created before the watch existed


def unschedule(observer: Any, runtime: JobRuntime) -> None:
    if runtime.watch is None:
        return
    with contextlib.suppress(KeyError, ValueError, OSError):
        observer.unschedule(runtime.watch)
    runtime.watch = None
    runtime.watch_inode = None

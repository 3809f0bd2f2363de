"""watchdog glue: filesystem events into a DumpDirTracker (events are hints; scans are truth)."""

from __future__ import annotations

from typing import ClassVar

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

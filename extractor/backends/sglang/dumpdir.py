"""The client's side of the dump directory (``--transport shm``): backpressure before each new
request, orphaned files from an earlier run reused or removed, and a clean directory at the end.

Dump files are named ``<rid>.safetensors`` with ``rid = r<row>-<owner><run nonce>-<attempt>``:
``owner`` marks the output directory (:func:`owner_of`), so a resumed run knows which row an orphan
of its own holds, and never takes, nor removes, the files of another output's run that shares the
dump directory. The plugin writes ``.<rid>.safetensors.tmp`` first (a server killed mid-write leaves
only that, removed here) and ``<rid>.error`` when it fails. The directory is made 0700; one that
another user owns, or that its group or others may write, is refused in one line (:func:`check_private`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import stat
import threading
from pathlib import Path
from typing import Any

from extractor.backends.sglang.pool import Stopped
from extractor.errors import UsageError
from hsmon.contracts.pauses import Pause
from hsmon.contracts.units import format_bytes

DUMP_SUFFIX = ".safetensors"
ERROR_SUFFIX = ".error"  # the plugin's writer could not write the file: never an orphan, removed
PROBE_PREFIX = "probe-"  # control requests' rids (see backend._evidence): never a row's file
_RID = re.compile(r"^r(\d+)-([0-9a-f]+)-\d+$")
_PROBE = re.compile(r"^probe-([0-9a-f]+)-\d+$")


def owner_of(out: str | os.PathLike[str]) -> str:
    """The output directory's mark in its dump files' names: 8 hex digits of its real path."""
    return hashlib.sha256(os.path.realpath(out).encode()).hexdigest()[:8]


def row_of(name: str, owner: str = "") -> int | None:
    """The row a dump file (or rid) of ``owner``'s belongs to, None for other files."""
    rid = name.removesuffix(DUMP_SUFFIX).removesuffix(ERROR_SUFFIX)
    match = _RID.match(rid)
    return int(match.group(1)) if match and match.group(2).startswith(owner) else None


def owned(name: str, owner: str) -> bool:
    """A file of ``owner``'s runs: a dump, an error, a probe or a temporary of one."""
    rid = name.lstrip(".").removesuffix(".tmp").removesuffix(DUMP_SUFFIX).removesuffix(ERROR_SUFFIX)
    match = _RID.match(rid) or _PROBE.match(rid)
    group = match.group(2) if match and match.re is _RID else (match.group(1) if match else None)
    return group is not None and group.startswith(owner)


def check_private(path: Path) -> str | None:
    """Why the dump directory ``path`` is refused (None: it is only ours, or absent): it must be a
    directory of this user that neither its group nor others may write, in a parent that is ours
    too, or root's and closed (or sticky, as /dev/shm is)."""
    me = os.geteuid()
    for where, leaf in ((path, True), (path.parent, False)):
        try:
            st = os.lstat(where)
        except FileNotFoundError:
            continue
        mode = stat.S_IMODE(st.st_mode)
        if not stat.S_ISDIR(st.st_mode):
            return f"--dump-dir {path}: {where} is not a directory (a link?); give a directory of your own"
        if st.st_uid != me and (leaf or st.st_uid != 0 or (mode & stat.S_IWOTH and not mode & stat.S_ISVTX)):
            return (f"--dump-dir {path}: {where} belongs to uid {st.st_uid}, not to you (uid {me}): others "
                    "could read, fill or empty your dumps; give a directory of your own")
        if st.st_uid == me and mode & (stat.S_IWGRP | stat.S_IWOTH):
            return (f"--dump-dir {path}: {where} is writable by its group or others (mode {mode:04o}): "
                    f"chmod 700 {where}")
    return None


def make_private(path: Path) -> None:
    """Make ``path`` and its missing parents 0700 (what already exists is checked, not changed)."""
    missing = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for part in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(part, 0o700)


def dir_bytes(path: Path) -> int:
    total = 0
    with contextlib.suppress(FileNotFoundError), os.scandir(path) as entries:
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):
                if entry.is_file() and not entry.is_symlink():
                    total += entry.stat(follow_symlinks=False).st_size
    return total


def _why_text(path: Path, why: dict[str, Any]) -> str:
    if why["limit"] == "max_dump_bytes":
        return (f"the dump directory {path} holds {format_bytes(why['dump_bytes'])}, over --max-dump-bytes "
                f"{format_bytes(why['max_dump_bytes'])}")
    return (f"{format_bytes(why['free_bytes'])} free on the filesystem of {path}, under its reserve of "
            f"{format_bytes(why['min_free_bytes'])}")


class DumpDir:
    """Backpressure and orphan handling for one run's dump directory."""

    def __init__(self, path: Path, max_bytes: int, min_free: int, events: Any, progress: Any,
                 stop_event: threading.Event, poll_s: float = 0.2, owner: str = "") -> None:
        self.path, self.owner = path, owner
        self.max_bytes, self.min_free, self.poll_s = max_bytes, min_free, poll_s
        self.events, self.progress, self.stop_event = events, progress, stop_event
        self._lock = threading.Lock()
        self._pause = Pause("shm", events, progress)
        self.orphans: dict[int, Path] = {}

    def prepare(self) -> None:
        """Create the directory (0700; UsageError when it is not only ours); remember our
        complete-looking orphans by row, remove our temporaries. Another output's files stay."""
        make_private(self.path)
        refused = check_private(self.path)
        if refused:
            raise UsageError(refused)
        for entry in self.path.iterdir():
            if not owned(entry.name, self.owner):
                continue
            row = row_of(entry.name, self.owner)
            if entry.name.endswith(DUMP_SUFFIX) and row is not None and row not in self.orphans:
                self.orphans[row] = entry
            elif entry.is_file() and not entry.is_symlink():
                entry.unlink(missing_ok=True)

    def take_orphan(self, row: int) -> Path | None:
        with self._lock:
            return self.orphans.pop(row, None)

    def _why_full(self) -> dict[str, Any] | None:
        used = dir_bytes(self.path)
        if used > self.max_bytes:
            return {"limit": "max_dump_bytes", "dump_bytes": used, "max_dump_bytes": self.max_bytes}
        free = shutil.disk_usage(self.path).free
        if free < self.min_free:
            return {"limit": "shm_free", "free_bytes": free, "min_free_bytes": self.min_free}
        return None

    def wait_for_room(self) -> None:
        """Block new requests while the dump dir is over ``--max-dump-bytes`` or its filesystem's
        free space is under the reserve; ``pause``/``resume`` events with reason ``shm``."""
        while True:
            why = self._why_full()
            if why is None:
                self._pause.end(f"room again in {self.path}", path=str(self.path))
                return
            self._pause.begin(_why_text(self.path, why),
                              "the server's dump files to be consumed (stop with SIGTERM)", self.poll_s,
                              path=str(self.path), **why)
            if self.stop_event.wait(self.poll_s):
                raise Stopped

    def clean(self) -> None:
        """Remove what this run left (orphans not reused, late files); the directory too if empty."""
        self.orphans.clear()
        with contextlib.suppress(FileNotFoundError):
            for entry in self.path.iterdir():
                if owned(entry.name, self.owner) and entry.is_file() and not entry.is_symlink():
                    entry.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.path.rmdir()

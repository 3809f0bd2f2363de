"""What the kernel says about a watched process that vanished: an OOM kill.

A process killed by the kernel's OOM killer (SIGKILL) leaves no traceback and often an empty,
buffered log, so by its own traces it looks like a clean exit. The kernel keeps the evidence:

- its memory cgroup counts OOM kills: ``oom_kill N`` in ``memory.events.local`` (cgroup v2; its
  own kills, not its descendants') or in ``memory.oom_control`` (cgroup v1, local), read once
  while the process lives and once when it is gone. A count that rose says an OOM kill happened
  in the process's cgroup while it ran, not that it was the one killed. It is a verdict only when
  the cgroup holds this job alone: its ``cgroup.procs`` listed nothing but the process and its
  descendants at every look (each poll while it lived, and once when it was gone: a process left
  there that was never its descendant makes it shared). In a shared cgroup (a container, a pod,
  a Slurm step, a service with other processes) the count is only a hint beside the job's real
  ending (``OomEvidence.hint``); a sibling that joined and was killed between two looks is not
  seen, which is why the kernel log's line, naming the PID, is the reason whenever readable;
- the kernel log (``/dev/kmsg``, readable as root) has the line "Out of memory: Killed process
  PID (NAME) ..." ("Memory cgroup out of memory: ..." for a cgroup's limit).

``CgroupWatch`` notes the process's cgroup file while it lives; ``oom_evidence`` reads what is
readable, once, when it is gone. The parsers are pure (tests feed them recorded lines and files).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

_KILLED = re.compile(r"Killed process (\d+) \(([^)]*)\)")
KMSG = "/dev/kmsg"
KMSG_MAX_RECORDS = 20000  # the ring buffer holds a few thousand; never read forever
CGROUP_MAX_PROCS = 256  # a cgroup with more processes is shared; its members are not walked


def oom_kill_count(text: str) -> int | None:
    """The ``oom_kill N`` count of a memory.events (v2) or memory.oom_control (v1) file."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def kmsg_message(record: str) -> tuple[float | None, str]:
    """(seconds since boot, text) of one /dev/kmsg record "PRIO,SEQ,USEC,FLAGS;TEXT" (continuation
    lines dropped); (None, the line) for a line without that header."""
    head, sep, text = record.partition(";")
    fields = head.split(",")
    if sep and len(fields) >= 3 and fields[2].isdigit():
        return int(fields[2]) / 1e6, text.split("\n", 1)[0]
    return None, record.split("\n", 1)[0]


def oom_kill_line(
    records: Iterable[tuple[float | None, str]], pid: int, since: float | None = None
) -> str | None:
    """The kernel's last "Killed process PID (...)" line about ``pid`` logged at or after ``since``
    (seconds since boot: the process's start, so that a reused PID's old kill does not count)."""
    found = None
    for when, message in records:
        match = _KILLED.search(message)
        if match and int(match.group(1)) == pid and (since is None or when is None or when >= since):
            found = message.strip()
    return found


def start_since_boot(pid: int, proc: str = "/proc") -> float | None:
    """When ``pid`` started, in seconds since boot (field 22 of /proc/PID/stat), the kernel log's clock."""
    text = _read(f"{proc}/{pid}/stat")
    if not text or ")" not in text:
        return None
    fields = text.rsplit(")", 1)[1].split()
    try:
        return int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (IndexError, ValueError, OSError):
        return None


def read_kmsg(path: str = KMSG) -> list[tuple[float | None, str]] | None:
    """The kernel log's records still in the ring buffer (texts); None when not readable (not root)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    messages = []
    try:
        for _ in range(KMSG_MAX_RECORDS):
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break  # the end of the buffer
            except BrokenPipeError:
                continue  # records overwritten while reading: go on with the next
            if not record:
                break
            messages.append(kmsg_message(record.decode("utf-8", "replace")))
    except OSError:
        return messages or None
    finally:
        os.close(fd)
    return messages


def _cgroup_roots(mounts: str) -> tuple[Path | None, Path | None]:
    """(the cgroup v2 mount, the cgroup v1 memory controller's mount) from /proc/mounts text."""
    v2 = v1 = None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        if fields[2] == "cgroup2" and v2 is None:
            v2 = Path(fields[1])
        elif fields[2] == "cgroup" and "memory" in fields[3].split(",") and v1 is None:
            v1 = Path(fields[1])
    return v2, v1


def memory_cgroup_file(cgroup: str, mounts: str) -> Path | None:
    """The file that counts OOM kills for a process, from its /proc/PID/cgroup and /proc/mounts."""
    v2, v1 = _cgroup_roots(mounts)
    for line in cgroup.splitlines():
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        rel = path.strip().lstrip("/")
        if "memory" in controllers.split(",") and v1 is not None:
            return v1 / rel / "memory.oom_control"
        if controllers == "" and v2 is not None:
            # the cgroup's own kills (memory.events counts its descendants' too)
            for name in ("memory.events.local", "memory.events"):
                if (v2 / rel / name).exists():
                    return v2 / rel / name
    return None


def _read(path: Path | str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def _ppid(pid: int, proc: str) -> int | None:
    text = _read(f"{proc}/{pid}/stat")
    if not text or ")" not in text:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


def _descends_from(pid: int, root: int, proc: str) -> bool:
    """``pid`` is ``root`` or one of its descendants (a walk up /proc/PID/stat's parent PIDs)."""
    for _ in range(64):
        if pid == root:
            return True
        parent = _ppid(pid, proc)
        if parent is None or parent <= 1:
            return False
        pid = parent
    return False


def cgroup_pids(path: Path | None) -> list[int] | None:
    """The PIDs in the cgroup whose counting file is ``path`` (its ``cgroup.procs``); None: unreadable."""
    text = _read(path.parent / "cgroup.procs") if path is not None else None
    if text is None:
        return None
    return [int(word) for word in text.split() if word.isdigit()]


@dataclass
class CgroupWatch:
    """A live process's memory cgroup file, its OOM-kill count then, and whether the cgroup held only
    the process and its descendants at every look (``shared`` None: not known, e.g. unreadable)."""

    pid: int
    path: Path | None
    count: int | None
    started: float | None = None  # seconds since boot
    shared: str | None = None  # why the cgroup is not the job's own ("PID 812 (not its descendant)")
    members: set[int] = field(default_factory=set)  # the process and descendants seen in it
    proc: str = "/proc"

    @classmethod
    def of(cls, pid: int, proc: str = "/proc") -> CgroupWatch:
        cgroup, mounts = _read(f"{proc}/{pid}/cgroup"), _read(f"{proc}/mounts")
        path = memory_cgroup_file(cgroup, mounts) if cgroup and mounts else None
        text = _read(path) if path is not None else None
        watch = cls(pid, path, oom_kill_count(text) if text else None, start_since_boot(pid, proc), proc=proc)
        watch.look()
        return watch

    def look(self, alive: bool = True) -> None:
        """Note who is in the cgroup now (each poll while the process lives; once when it is gone)."""
        if self.shared is not None or self.path is None:
            return
        pids = cgroup_pids(self.path)
        if pids is None:
            self.shared = "its cgroup.procs is not readable"
        elif len(pids) > CGROUP_MAX_PROCS:
            self.shared = f"it holds {len(pids)} processes"
        for pid in pids or []:
            if self.shared is not None:
                break
            if pid in self.members:
                continue
            if alive and _descends_from(pid, self.pid, self.proc):
                self.members.add(pid)
            else:
                self.shared = f"it holds PID {pid}, not this job's process or a descendant of it"


@dataclass(frozen=True)
class OomEvidence:
    """What the kernel said about a process that is gone."""

    line: str | None  # the kernel log's "Killed process PID ..." line
    cgroup: str | None  # "its memory cgroup PATH ... counted N OOM kill(s) while it ran"
    shared: bool = False  # the cgroup held other processes: its count is a hint, not a verdict

    @property
    def killed(self) -> bool:
        """The evidence names this process: the kernel's line, or a count in a cgroup of its own."""
        return self.line is not None or (self.cgroup is not None and not self.shared)

    def reason(self) -> str:
        return self.line if self.line is not None else str(self.cgroup)

    @property
    def hint(self) -> str | None:
        """A shared cgroup's count that nothing ties to this process (None when it is the verdict)."""
        return None if self.killed else self.cgroup


def oom_evidence(watch: CgroupWatch, kmsg: str = KMSG) -> OomEvidence:
    """Read the kernel's evidence about ``watch.pid`` once: its cgroup's OOM count, the kernel log."""
    cgroup = None
    if watch.path is not None and watch.count is not None:
        text = _read(watch.path)
        after = oom_kill_count(text) if text else None
        if after is not None and after > watch.count:
            watch.look(alive=False)
            whose = (f"shared: {watch.shared}" if watch.shared is not None
                     else f"it held only PID {watch.pid} and its descendants at every look")  # fmt: skip
            cgroup = (
                f"its memory cgroup {watch.path.parent} ({whose}) counted {after - watch.count} OOM "
                f"kill(s) while it ran (oom_kill {watch.count} -> {after})"
            )
    records = read_kmsg(kmsg)
    since = None if watch.started is None else watch.started - 1.0  # the two clocks' rounding
    line = oom_kill_line(records, watch.pid, since) if records else None
    return OomEvidence(line[:300] if line else None, cgroup, shared=watch.shared is not None)

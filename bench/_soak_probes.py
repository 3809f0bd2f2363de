"""The soak's probes and its small disk: a process's open fds by kind, the TUI's figures, and the
tmpfs of the disk-full fault."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    from soak import Job

DISK_MB = 4  # the small tmpfs of the disk-full fault


def fd_kinds(pid: int) -> dict[str, int]:
    """What a process's open fds are (socket, pipe, anon_inode:inotify, a file's directory)."""
    kinds: dict[str, int] = {}
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("anon_inode:"):
            kind = target
        elif ":" in target and not target.startswith("/"):
            kind = target.split(":")[0]  # socket:[inode], pipe:[inode]
        else:
            kind = str(Path(target).parent)
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def tui_figures() -> dict[str, float]:
    """The `hsmon tui` process's RSS (MB), open fds and threads (the python in the tmux pane)."""
    nan = float("nan")
    out = subprocess.run(["tmux", "list-panes", "-t", "hsmon-soak", "-F", "#{pane_pid}"],
                         capture_output=True, text=True).stdout.split()
    try:
        pane = psutil.Process(int(out[0]))
        proc = max([pane, *pane.children(recursive=True)], key=lambda p: p.memory_info().rss)
        return {"tui_rss_mb": proc.memory_info().rss / 2**20, "tui_fds": proc.num_fds(),
                "tui_threads": proc.num_threads()}
    except (IndexError, ValueError, psutil.Error):
        return {"tui_rss_mb": nan, "tui_fds": nan, "tui_threads": nan}


class SmallDisk:
    """A real tmpfs of DISK_MB MiB mounted for the disk-full fault (needs root), and its ballast."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(path)],
                              capture_output=True, text=True)
        self.mounted = done.returncode == 0
        if not self.mounted:
            print(f"disk fault not injected: cannot mount a tmpfs on {path}: {done.stderr.strip()}",
                  flush=True)
        self.job: Job | None = None  # the job writing on it, once injected

    def fill(self, leave: int) -> None:
        st = os.statvfs(self.path)
        with open(self.path / "ballast", "wb") as fh:
            fh.write(b"\0" * max(0, st.f_bavail * st.f_frsize - leave))

    def empty(self) -> None:
        (self.path / "ballast").unlink(missing_ok=True)

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], check=False)

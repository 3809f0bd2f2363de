"""The engine's own leftovers in /dev/shm, removed once its server has exited.

SGLang and vLLM keep state in POSIX shared memory (SGLang's load snapshots `sglang_loads_*.shm`,
the message queues and broadcasts of Python's `multiprocessing.shared_memory` `psm_*`, named
semaphores `sem.mp-*`, NCCL's `nccl-*`) and unlink it on a clean exit only; their own teardown kills
children with SIGKILL (`kill_process_tree`), so every server stopped by a signal left some behind:
13 load snapshots, and on CPU 160 to 250 MB of message queue per server, in RAM until the reboot.

What `hsmon sglang-serve` / `vllm-serve` remove after their server exits: the entries of those
families that appeared in /dev/shm while it ran, are this user's, and that no live process holds
open or mapped (another server beside it keeps its own). Anything else there is left alone.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

SHM = Path("/dev/shm")
FAMILIES = ("sglang_loads_", "sgl_shm_", "psm_", "sem.mp-", "nccl-", "cuda.shm.")
SLACK_S = 2.0  # a file's times are the filesystem's clock, a little coarser than time.time()


class ShmLeftovers:
    """Started before the server: :meth:`sweep` once it has exited."""

    def __init__(self, shm: Path = SHM) -> None:
        self.shm = shm
        self.started = time.time() - SLACK_S
        self.before = set(_names(shm))

    def candidates(self) -> list[Path]:
        """The engine families' entries that appeared since the start, owned by this user."""
        found = []
        for name in _names(self.shm):
            if name in self.before or not name.startswith(FAMILIES):
                continue
            path = self.shm / name
            with contextlib.suppress(OSError):
                st = path.lstat()
                if st.st_uid == os.getuid() and max(st.st_ctime, st.st_mtime) >= self.started:
                    found.append(path)
        return found

    def sweep(self) -> list[str]:
        """Remove the candidates no live process holds; the names removed."""
        candidates = self.candidates()
        if not candidates:
            return []
        held = held_paths(self.shm)
        removed = []
        for path in candidates:
            if str(path) in held:
                continue
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path.name)
        return removed


def _names(shm: Path) -> list[str]:
    try:
        return os.listdir(shm)
    except OSError:
        return []


def held_paths(shm: Path = SHM) -> set[str]:
    """The entries under ``shm`` some live process holds open or mapped (the processes this user may
    read: a server of another user keeps files this user could not remove anyway)."""
    prefix = str(shm).rstrip("/") + "/"
    held: set[str] = set()
    for pid in (p for p in _names(Path("/proc")) if p.isdigit()):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/maps", encoding="utf-8",
                                                 errors="replace") as maps:
                for line in maps:
                    at = line.find(prefix)
                    if at >= 0:
                        held.add(line[at:].rstrip("\n").removesuffix(" (deleted)"))
        fd_dir = f"/proc/{pid}/fd"
        for fd in _names(Path(fd_dir)):
            with contextlib.suppress(OSError):
                target = os.readlink(f"{fd_dir}/{fd}")
                if target.startswith(prefix):
                    held.add(target)
    return held

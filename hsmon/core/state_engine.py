"""The job state machine's view of the engine: hints and reasons about a job's inference servers
and GPUs (hsmon/core/trackers/server.py, gpu.py measure them). Pure, like state.py, which calls it."""

from __future__ import annotations

from hsmon.core.state_facts import Hint, ServerFacts, Snapshot, fmt_seconds


def _no_forward(snap: Snapshot, server: ServerFacts) -> str:
    since = server.last_forward_ts or server.watch_start_ts or snap.watch_start_ts
    return f"no forward completed in {fmt_seconds(max(0.0, snap.now - since))}"


def engine_hints(snap: Snapshot) -> list[Hint]:
    """Advice about the job's servers and GPUs (a job that ended or died needs none)."""
    hints: list[Hint] = []
    for server in snap.servers:
        if server.state == "hung":
            hints.append(
                Hint(
                    "server-hung",
                    "critical",
                    f"server {server.url} is hung: {server.detail}. "
                    "Its scheduler is stuck (a collective, a dead GPU, a frozen process): look with "
                    "`py-spy dump` on its scheduler processes and nvidia-smi, then restart the server; "
                    "the client resumes where it stopped.",
                )
            )
        elif server.state == "down":
            hints.append(
                Hint(
                    "server-down",
                    "warning",
                    f"server {server.url} is down ({server.detail}): the client cannot progress "
                    "until it is back.",
                )
            )
    alive = any(p.alive and p.status != "zombie" for p in snap.processes)
    if snap.gpu_indices and snap.gpu_idle_since_ts is not None and alive:
        idle = max(0.0, snap.now - snap.gpu_idle_since_ts)
        if idle > snap.stall_after:
            gpus = ", ".join(str(i) for i in snap.gpu_indices)
            hints.append(
                Hint(
                    "gpu-idle",
                    "warning",
                    f"GPU {gpus} of the job's processes at 0 % utilization for {fmt_seconds(idle)} "
                    f"(stall-after {fmt_seconds(snap.stall_after)}) while they are alive: a hung collective "
                    "(NCCL) or a stuck scheduler? `py-spy dump` the processes to see where they wait.",
                )
            )
    return hints


def server_blame(snap: Snapshot) -> str | None:
    """The reason a stalled or paused client waits, when one of its servers explains it."""
    for state in ("hung", "down"):
        for server in snap.servers:
            if server.state == state:
                if state == "hung":
                    return f"server {server.url} is hung: {_no_forward(snap, server)}"
                return f"server {server.url} is down ({server.detail})"
    return None

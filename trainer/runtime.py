"""What a training process runs beside its loop: rank and world (torchrun), the heartbeat thread, the
learning-rate schedule, and the RNG state an exact resume restores."""

from __future__ import annotations

import math
import os
import random
import signal
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from hsmon.contracts import events as ev
from trainer.model import Eagle3Drafter


class StopRequest(threading.Event):
    """The training's stop flag, with the signal that set it (None: another rank's, or none)."""

    signum: int | None = None


def stopped_fields(stop: threading.Event, step: int, total_steps: int | None, resume: str) -> dict[str, Any]:
    """The ``stopped`` event's fields besides the reason: the signal, how far, what resumes it."""
    signum = getattr(stop, "signum", None) or signal.SIGTERM
    fields: dict[str, Any] = {"signal": signal.Signals(signum).name, "step": step, "resume": resume}
    if total_steps:
        fields["total_steps"] = total_steps
    return fields


def exit_status(stop: threading.Event) -> int:
    """The exit status of a run ``stop`` ended: 128 + the signal's number (130 SIGINT, 143 SIGTERM; a
    rank that saw no signal itself: SIGTERM's), the shell's convention, so no wrapper takes it for
    success."""
    return 128 + (getattr(stop, "signum", None) or signal.SIGTERM)


def lr_lambda_factory(total_steps: int, warmup_steps: int, min_ratio: float) -> Callable[[int], float]:
    """Linear warmup then cosine decay to ``min_ratio`` of the peak."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def world_size() -> int:
    """Processes of this training: torchrun's WORLD_SIZE, 1 when not under torchrun."""
    return int(os.environ.get("WORLD_SIZE", "1"))


class Dist:
    """Rank and world of this process (a single process when not under torchrun)."""

    def __init__(self) -> None:
        self.world = world_size()
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.enabled = self.world > 1
        if torch.cuda.is_available():
            self.device = torch.device("cuda", self.local_rank)
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device("cpu")
        if self.enabled and not dist.is_initialized():
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def all_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            dist.all_reduce(tensor)
        return tensor

    def close(self, finished: bool = False) -> None:
        """Leave the process group. After a run every rank finished, meet first: a rank that tore
        down its group while its peer was still in its last steps made the peer abort at exit
        ("terminate called without an active exception", SIGABRT) in about one run in four."""
        if self.enabled and dist.is_initialized():
            if finished:
                dist.barrier()
            dist.destroy_process_group()


class Heartbeat:
    """Emits a heartbeat event with the given counters every ``every`` seconds (rank 0 only)."""

    def __init__(self, writer: ev.EventWriter | None, every: float, counters: dict[str, Any]) -> None:
        self.writer, self.every, self.counters = writer, every, counters
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hsmon-heartbeat", daemon=True)
        if writer is not None and every > 0:
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.writer.emit(ev.HEARTBEAT, **dict(self.counters))
            except ValueError:  # the writer was closed under us: the run is over
                return

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)


def rng_state() -> dict[str, Any]:
    """Every generator a step draws from (torch, Python, CUDA), for the checkpoint."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` saved (an exact resume)."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def ranks_in_sync(drafter: Eagle3Drafter, world: Dist) -> bool:
    """True when every process holds the same parameters (DDP kept them together)."""
    if not world.enabled:
        return True
    checksum = torch.stack([p.detach().double().sum() for p in drafter.parameters()]).cpu()
    gathered = [torch.zeros_like(checksum) for _ in range(world.world)]
    dist.all_gather(gathered, checksum)
    return all(torch.equal(gathered[0], g) for g in gathered[1:])

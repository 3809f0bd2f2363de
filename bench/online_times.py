"""Where bench/online.py's online run spent its time, from the trainer's events and each process's
CPU seconds (rusage): the overlap figure alone cannot tell a serialisation in the product from a
shared machine's load.

- the trainer's first step, in seconds after the bench started both sides (its own start-up, and
  its set-up wait: its first event to its ``start``, for the extractor's start-up and the rows of
  half the spool, trainer/follow_setup.py), when it cannot step;
- the steps: its first step to its last, and the saves in between (each a checkpoint, needed before
  a chunk is freed);
- CPU: the trainer's CPU seconds online over alone (its own extra work online: saves, polls) and
  the share of a core it got online and alone (CPU ÷ wall; on an idle machine with a core per side
  both are near 1; less online than alone means other processes took its core, not the spool);
- the scheduler's account of the trainer (/proc/PID/schedstat, sampled until it ends): seconds on
  a CPU, seconds runnable but waiting for one (other processes on its core: the load), and the
  rest of its wall (asleep: its polls for rows, and blocked: the saves' fsyncs).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any


class SchedWatch:
    """The last /proc/PID/schedstat reading of a process (its threads summed), every 0.1 s."""

    def __init__(self, pid: int) -> None:
        self.pid, self.on_cpu, self.runnable = pid, 0.0, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        on = wait = 0
        try:
            for task in Path(f"/proc/{self.pid}/task").iterdir():
                fields = (task / "schedstat").read_text().split()
                on, wait = on + int(fields[0]), wait + int(fields[1])
        except (OSError, ValueError, IndexError):
            return
        self.on_cpu, self.runnable = max(self.on_cpu, on / 1e9), max(self.runnable, wait / 1e9)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self._read()

    def close(self) -> tuple[float, float]:
        self._stop.set()
        self._thread.join()
        return self.on_cpu, self.runnable


def online_timeline(events: list[dict[str, Any]], cpu: dict[str, float], started: float, online_s: float,
                    extract_online_s: float, train_alone_s: float,
                    sched: dict[str, tuple[float, float]]) -> dict[str, float]:
    """``started``: the wall clock (time.time) when the bench started both sides."""
    first = events[0]["ts"]
    start = next(e["ts"] for e in events if e["kind"] == "start")
    steps = [e["ts"] for e in events if e["kind"] == "step"]
    saves = sum(1 for e in events if e["kind"] == "checkpoint")
    on, alone = cpu.get("train_online", 0.0), cpu.get("train_alone", 0.0)
    out = {
        "first_step_s": steps[0] - started if steps else float("nan"),
        "setup_wait_s": start - first,
        "steps_s": steps[-1] - steps[0] if steps else 0.0,
        "saves": float(saves),
        "train_cpu_ratio": on / alone if alone else float("nan"),
        "train_core_online": on / online_s if online_s else float("nan"),
        "train_core_alone": alone / train_alone_s if train_alone_s else float("nan"),
    }
    print(f"online timeline: the trainer's first step {out['first_step_s']:.1f} s after both started; "
          f"it waited {out['setup_wait_s']:.1f} s for its set-up sample, then "
          f"stepped for {out['steps_s']:.1f} s with {saves} saves; the extraction ended after "
          f"{extract_online_s:.1f} s. CPU: trainer {on:.1f} s online against {alone:.1f} s alone "
          f"(x{out['train_cpu_ratio']:.2f}); it got {out['train_core_online']:.0%} of a core online, "
          f"{out['train_core_alone']:.0%} alone; extractor {cpu.get('extract_online', 0.0):.1f} s online, "
          f"{cpu.get('extract_alone', 0.0):.1f} s alone", flush=True)
    for side, wall in (("online", online_s), ("alone", train_alone_s)):
        on_cpu, runnable = sched.get(side, (float("nan"), float("nan")))
        out[f"train_runnable_{side}_s"] = runnable
        out[f"train_asleep_{side}_s"] = wall - on_cpu - runnable
        print(f"  the trainer {side}: {wall:.1f} s of wall: {on_cpu:.1f} s on a CPU, {runnable:.1f} s "
              f"waiting for one (the load), {wall - on_cpu - runnable:.1f} s asleep or blocked "
              "(polls, fsyncs, start-up reads)", flush=True)
    return out

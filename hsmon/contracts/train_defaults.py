"""`hsmon train`'s defaults, in one place: the command line, the TUI's form, the daemon's launch API
and `hsmon online` all read them (measured on the embedded target: docs/benchmarks.md, "Defaults").

A run whose estimated acceptance length stays under ``NO_SPEEDUP_BELOW`` has learnt too little to
speed anything up; `no_speedup_advice` is the line that says so, with what to change.
`checkpoint_step_in` reads the step of a training's newest checkpoint from its name (no torch):
the trainer refuses a new run over it, the launch API and the form say so before launching.
"""

from __future__ import annotations

import os
import re

EPOCHS = 4
LR = 2e-3
BATCH_TOKENS = 4096
TTT_LENGTH = 7
# estimated acceptance length (1 + the chance of each drafted prefix being right) under which a
# drafter brings no speed-up worth having
NO_SPEEDUP_BELOW = 1.1


def no_speedup_advice(accept_len_est: float | None, lr: float | None = None,
                      epochs_or_passes: str = "--epochs") -> str | None:
    """The "no speed-up yet" line for an estimated acceptance length under `NO_SPEEDUP_BELOW`
    (None when the estimate is missing or good enough)."""
    if accept_len_est is None or accept_len_est >= NO_SPEEDUP_BELOW:
        return None
    hints = [f"train longer (more {epochs_or_passes} or rows)"]
    if lr is not None and lr < LR:
        hints.append(f"raise --lr (this run {lr:g}, default {LR:g})")
    hints.append("or a smaller --draft-vocab-size")
    return (f"no speed-up yet: estimated acceptance length {accept_len_est:.3f} "
            f"(under {NO_SPEEDUP_BELOW}); {', '.join(hints)}")


CHECKPOINT_DIR = "checkpoints"
CHECKPOINT_NAME = re.compile(r"^step-(\d+)\.pt$")  # OUT/checkpoints/step-00000013.pt (trainer/checkpoint.py)


def checkpoint_step_in(out_dir: str | os.PathLike[str]) -> int | None:
    """The step of the newest checkpoint a training left in ``out_dir``, by its name, or None."""
    try:
        found = [CHECKPOINT_NAME.match(name) for name in os.listdir(os.path.join(out_dir, CHECKPOINT_DIR))]
    except OSError:
        return None
    steps = [int(match.group(1)) for match in found if match]
    return max(steps) if steps else None

"""What one training is asked to do (`hsmon train`'s options), read by the set-up and the step loop."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hsmon.contracts import train_defaults as defaults
from hsmon.contracts.heldout import DEFAULT_EVAL_FRACTION
from trainer.nonfinite import DEFAULT_MAX_BAD_FRACTION, DEFAULT_MAX_SKIPS_IN_A_ROW


@dataclass
class TrainSettings:
    """`hsmon train`'s options for one training (trainer/cli.py maps the command line onto them)."""

    data_dir: Path
    target: Path
    out: Path
    epochs: int | None = None  # None: train_defaults.EPOCHS (with --max-steps alone: epochs cycle)
    max_steps: int | None = None
    ttt_length: int = defaults.TTT_LENGTH
    # drafter architecture (trainer/model.py ARCHS); None: eagle3 for a new run, the checkpoint's on resume
    arch: str | None = None
    draft_vocab_size: int | None = None
    lr: float = defaults.LR
    batch_tokens: int = defaults.BATCH_TOKENS
    events: str | None = None
    resume: bool = False
    restart: bool = False  # --restart: the checkpoints of --out are removed, the run starts at step 0
    launched: bool = False  # started through the daemon's launch API (the TUI's form): say its buttons
    warmup_ratio: float = 0.03
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    max_length: int | None = 2048
    eval_fraction: float = DEFAULT_EVAL_FRACTION
    eval_every: int = 0
    eval_batches: int = 50
    checkpoint_every: int = 1000
    keep_checkpoints: int = 2
    log_every: int = 1
    heartbeat_s: float = 10.0
    seed: int = 0
    time_limit_s: float | None = None
    job: str = "train"
    max_bad_fraction: float = DEFAULT_MAX_BAD_FRACTION
    max_skips_in_a_row: int = DEFAULT_MAX_SKIPS_IN_A_ROW
    # `--follow` (trainer/follow.py): passes each row gets, delete chunks once trained, how often
    # the spool is polled, replay-window rows (0: eight batches' worth)
    follow: bool = False
    follow_passes: int = 1
    follow_consume: bool = False
    follow_poll_s: float = 0.1
    follow_window: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

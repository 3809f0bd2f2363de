"""Training checkpoints: OUT/checkpoints/step-NNNNNNNN.pt, written atomically, newest in LATEST.

Nothing in an output directory is code: a checkpoint is loaded with ``weights_only=True`` (tensors,
numbers, strings and the containers of them: all that hsmon saves), LATEST may only name a
``step-N.pt`` of its own directory, and a file that is not one of ours is refused in one line
(`CheckpointRefused`) before anything of it runs.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import re
from pathlib import Path
from typing import Any

import torch

from hsmon.contracts import nofollow
from hsmon.contracts.layout import atomic_write

CHECKPOINT_DIR = "checkpoints"
LATEST_NAME = "LATEST"
CHECKPOINT_RE = re.compile(r"^step-(\d+)\.pt$")


class CheckpointRefused(ValueError):
    """A checkpoint or LATEST that hsmon did not write; the message is one line naming the file."""


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}.pt"


def save_checkpoint(out: Path, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Write a checkpoint atomically, point LATEST at it, and prune all but the ``keep`` newest
    (no link followed: hsmon/contracts/nofollow.py)."""
    directory = Path(out) / CHECKPOINT_DIR
    buffer = io.BytesIO()
    torch.save(state, buffer)
    path = directory / checkpoint_name(step)
    atomic_write(path, lambda fh: fh.write(buffer.getbuffer()))
    atomic_write(directory / LATEST_NAME, lambda fh: fh.write(path.name.encode() + b"\n"))
    dir_fd, _ = nofollow.parent_dir(path)
    try:
        existing = sorted(name for name in os.listdir(dir_fd) if CHECKPOINT_RE.match(name))
        for old in existing[: max(0, len(existing) - keep)]:
            if old != path.name:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(old, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    return path


def latest_checkpoint(out: Path) -> Path | None:
    """The newest complete checkpoint of a training output directory (or of its checkpoints/).
    CheckpointRefused when LATEST names anything but a step-N.pt of its directory."""
    out = Path(out)
    directory = out if out.name == CHECKPOINT_DIR else out / CHECKPOINT_DIR
    latest = directory / LATEST_NAME
    if latest.is_file():
        named = latest.read_text(errors="replace").strip()
        if not CHECKPOINT_RE.match(named):
            raise CheckpointRefused(
                f"{latest} names {named[:80]!r}, not a step-N.pt of its own directory: refused (hsmon "
                f"writes only such names); remove {latest} to resume from the newest step-N.pt")
        candidate = directory / named
        if candidate.is_file():
            return candidate
    found = sorted(p for p in directory.glob("step-*.pt") if CHECKPOINT_RE.match(p.name))
    return found[-1] if found else None


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint's name records (step-00000013.pt: 13)."""
    found = CHECKPOINT_RE.match(Path(path).name)
    return int(found.group(1)) if found else 0


def remove_checkpoints(out: Path) -> int:
    """Remove a training output's checkpoints and LATEST (`hsmon train --restart`); how many went."""
    directory = Path(out) / CHECKPOINT_DIR
    removed = 0
    for path in sorted(directory.glob("step-*")) if directory.is_dir() else []:
        if CHECKPOINT_RE.match(path.name) or path.name.endswith(".eval.json"):
            path.unlink(missing_ok=True)
            removed += path.suffix == ".pt"
    (directory / LATEST_NAME).unlink(missing_ok=True)
    return removed


def load_checkpoint(path: Path) -> dict[str, Any]:
    """A checkpoint hsmon wrote, loaded as data only (``weights_only``: no pickled code runs);
    CheckpointRefused (one line) for any other file."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise CheckpointRefused(
            f"{path} is not a checkpoint hsmon wrote ({_why(exc)}): "
            "refused, nothing in it ran; remove it to resume from an earlier step, or start over "
            "in another --out") from None
    if not isinstance(state, dict) or not {"model", "step"} <= set(state):
        raise CheckpointRefused(f"{path} is not a checkpoint hsmon wrote (no model and step in it): refused; "
                                "remove it, or start over in another --out")
    return state


def _why(exc: BaseException) -> str:
    """What torch's data-only loader met, in a few words (its own message runs to a page)."""
    text = str(exc)
    found = re.search(r"(?:unsupported|Unsupported global:) GLOBAL ([\w.]+)", text)
    if found:
        return f"it asks to run {found.group(1)}, which a data-only load never does"
    boilerplate = ("Weights only load failed", "Please file", "Check the doc")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith(boilerplate)]
    return f"it does not load as data only: {(lines[0] if lines else type(exc).__name__)[:120]}"

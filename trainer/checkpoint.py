"""Training checkpoints: OUT/checkpoints/step-NNNNNNNN.pt, written atomically, newest in LATEST."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import torch

from hsmon.contracts.layout import atomic_write

CHECKPOINT_DIR = "checkpoints"
LATEST_NAME = "LATEST"
CHECKPOINT_RE = re.compile(r"^step-(\d+)\.pt$")


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}.pt"


def save_checkpoint(out: Path, step: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Write a checkpoint atomically, point LATEST at it, and prune all but the ``keep`` newest."""
    directory = Path(out) / CHECKPOINT_DIR
    directory.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    path = directory / checkpoint_name(step)
    atomic_write(path, lambda fh: fh.write(buffer.getbuffer()))
    atomic_write(directory / LATEST_NAME, lambda fh: fh.write(path.name.encode() + b"\n"))
    existing = sorted(p for p in directory.iterdir() if CHECKPOINT_RE.match(p.name))
    for old in existing[: max(0, len(existing) - keep)]:
        if old != path:
            old.unlink(missing_ok=True)
    return path


def latest_checkpoint(out: Path) -> Path | None:
    """The newest complete checkpoint of a training output directory (or of its checkpoints/)."""
    out = Path(out)
    directory = out if out.name == CHECKPOINT_DIR else out / CHECKPOINT_DIR
    latest = directory / LATEST_NAME
    if latest.is_file():
        candidate = directory / latest.read_text().strip()
        if candidate.is_file():
            return candidate
    found = sorted(p for p in directory.glob("step-*.pt") if CHECKPOINT_RE.match(p.name))
    return found[-1] if found else None


def load_checkpoint(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=False)

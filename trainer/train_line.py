"""`hsmon train` on a terminal: a progress line drawn from its own events (the events go to a file
there: OUT/events.jsonl unless --events), as every long command shows one (hsmon/contracts/progress_line.py).

    train ━━━━━━━━━╺━━━━━━━━━━  15% 13/88 steps  loss 5.94 · acc 41% · 812 tok/s · eta 3m20s

The loss and the accuracy are those of the first draft position (the next token: what the
acceptance starts from); the events keep every position's.
"""

from __future__ import annotations

import time
from typing import Any

from hsmon.contracts import events as ev
from hsmon.contracts.progress_line import ProgressLine
from hsmon.contracts.units import format_duration


class TrainLine:
    """Listens to the training's events (``EventWriter.listeners``) and redraws its line."""

    def __init__(self) -> None:
        self.line = ProgressLine("train", "steps")
        self.total: int | None = None
        self.first: tuple[float, int] | None = None  # (when, step) of the first step seen

    def event(self, event: dict[str, Any]) -> None:
        kind = event.get("kind")
        if kind == ev.START:
            self.total = event.get("total_steps")
            start = int(event.get("start_step") or 0)
            self.line.update(start, self.total, "loading done, first step under way")
        elif kind == ev.STEP:
            self._step(event)
        elif kind in (ev.DONE, ev.STOPPED, ev.ERROR):
            self.line.close()

    def _step(self, event: dict[str, Any]) -> None:
        step = int(event.get("step") or 0)
        self.total = event.get("total_steps") or self.total
        now = time.monotonic()
        if self.first is None:
            self.first = (now, step)
        figures = []
        losses, accs = event.get("losses") or [], event.get("accs") or []
        if losses:
            figures.append(f"loss {losses[0]:.3f}")
        if accs:
            figures.append(f"acc {accs[0]:.0%}")
        if isinstance(event.get("tokens_s"), (int, float)):
            figures.append(f"{event['tokens_s']:,.0f} tok/s")
        since, at = self.first
        if self.total and step > at and now > since:
            figures.append(f"eta {format_duration((self.total - step) * (now - since) / (step - at))}")
        self.line.update(step, self.total, " · ".join(figures))

    def close(self) -> None:
        self.line.close()

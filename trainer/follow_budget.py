"""The following trainer's step budget, kept true as the run goes (`hsmon train SPOOL --follow`).

The warmup-and-cosine schedule is laid over a step count that a following trainer cannot know at
start: the extraction's plan says how many rows will come, but how many rows a step takes depends on
the lengths the replay window will hold, and the set-up sample (a few chunks) is a poor sample of
them. Measured (bench/online.py --quick, load 2-3): a set-up sample of 7 rows laid the schedule over
135 steps for a run that took 111, so the online drafter trained at up to 1.9x the offline one's
learning rate in its second half and ended at 1.7x the floor, against an offline run laid over
exactly its steps. So, from the tenth step on, the budget is re-estimated every step: the steps
taken, plus the passes still to give (the tickets of the rows on hand, and E for every planned row
not yet arrived) over the rows per step measured so far in this run. The schedule (a LambdaLR)
reads the current budget; its warmup stays the one fixed at the first start.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from trainer.runtime import lr_lambda_factory
from trainer.window import Window

MIN_STEPS = 10  # steps measured before the rows per step are trusted


@dataclass
class StepBudget:
    """The steps the schedule is laid over. ``expected_rows``: the training rows the extraction's
    plan says will come (None: no plan, or --max-steps: the budget stays as given)."""

    total: int
    warmup: int
    passes: int
    expected_rows: int | None
    start_step: int
    credited: int = 0  # rows drawn (passes given) since this start

    def factor(self, min_ratio: float) -> Callable[[int], float]:
        """The learning-rate factor of a step under the budget as it is when the step is taken."""

        def current(step: int) -> float:
            return lr_lambda_factory(self.total, self.warmup, min_ratio)(step)

        return current

    def update(self, step: int, drawn: int, window: Window, ended: bool) -> int:
        """Count a taken step's rows and re-estimate; returns the budget."""
        self.credited += drawn
        taken = step - self.start_step
        if self.expected_rows is None or taken < MIN_STEPS or self.credited == 0:
            return self.total
        to_come = 0 if ended else max(0, self.expected_rows - window.rows_seen)
        remaining = window.tickets() + to_come * self.passes
        per_step = self.credited / taken
        self.total = max(step + 1, step + math.ceil(remaining / per_step))
        return self.total

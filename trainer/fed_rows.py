"""The rows each optimizer step really fed to the model, when asked for (HSMON_TRAIN_FED_ROWS=PATH):
the evidence the "every row exactly E passes" checks of the tests and bench/online.py count,
independent of the trainer's own ledger.

Each rank appends to ``PATH.<rank>`` one JSON line per taken step, after the weights were updated:
``{"step": s, "rows": [...]}``; a step skipped for non-finite values feeds nothing. At a rank's
first taken step it writes ``{"start": s}`` (the step it resumed from, 0 at first): the steps after
``s`` written by an earlier run were lost with their checkpoint (the weights went back to step
``s``), so `read_fed_rows` drops them, as the ledger drops their passes.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from hsmon.contracts import nofollow

FED_ROWS_ENV = "HSMON_TRAIN_FED_ROWS"


class FedRows:
    """One rank's log (no-op unless HSMON_TRAIN_FED_ROWS is set)."""

    def __init__(self, rank: int) -> None:
        base = os.environ.get(FED_ROWS_ENV)
        self.path = Path(f"{base}.{rank}") if base else None
        self._started = False

    def record(self, step_before: int, rows: list[int]) -> None:
        """A step taken from ``step_before`` to ``step_before + 1`` trained on ``rows``."""
        if self.path is None:
            return
        lines = [] if self._started else [{"start": step_before}]
        self._started = True
        lines.append({"step": step_before + 1, "rows": [int(r) for r in rows]})
        with open(nofollow.open_file(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "a") as fh:
            fh.write("".join(json.dumps(line) + "\n" for line in lines))


def read_fed_rows(base: str | os.PathLike[str]) -> Counter[int]:
    """How many surviving steps fed each row, over every rank's log (see the module's docstring)."""
    total: Counter[int] = Counter()
    for path in sorted(Path(base).parent.glob(f"{Path(base).name}.*")):
        steps: list[tuple[int, list[int]]] = []
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if "start" in record:
                steps = [s for s in steps if s[0] <= record["start"]]
            else:
                steps.append((record["step"], record["rows"]))
        for _, rows in steps:
            total.update(rows)
    return total

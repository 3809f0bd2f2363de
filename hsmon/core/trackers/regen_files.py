"""The regeneration layout of an output directory (`hsmon regenerate`, hsmon.contracts.regen_layout):
its manifest read incrementally into running totals (a tick reads what was appended since, a stat
when idle), for the output section (rows, tokens, bytes, rejects, the plan and the ending) and the
regeneration's own section (hsmon/core/trackers/regenerate.py)."""

from __future__ import annotations

import os
import time

from msgspec.structs import replace

from hsmon.contracts import regen_layout
from hsmon.contracts.manifest_reader import JsonlTail
from hsmon.contracts.regen_layout import RegenTotals
from hsmon.status_doc import OutputSection


class RegenFiles:
    """One output directory's regeneration manifest, followed as it grows."""

    def __init__(self, path: str) -> None:
        self.tail = JsonlTail(os.path.join(path, regen_layout.MANIFEST_NAME))
        self.totals = RegenTotals()
        self.read_ts: float | None = None  # when the figures were last brought up to date

    def poll(self) -> None:
        _, reset = self.tail.poll(self.totals.add)
        if reset:  # replaced or cut: read again from the start
            self.totals = RegenTotals()
            self.tail.poll(self.totals.add)
        self.read_ts = time.time()

    def section(self, empty: OutputSection) -> OutputSection:
        """``empty`` (the directory's blank section) with the regeneration's figures."""
        t = self.totals
        return replace(empty, layout="regenerate", chunks_complete=None, chunks_in_progress=None, rows=t.rows,
                       tokens=t.answer_tokens, bytes=t.end, temp_files=0, rejects=t.rejects,
                       rejects_by_reason=dict(t.reject_classes), **t.plan())

"""The regeneration contract: what `hsmon regenerate` writes in its ``--out``, and what the monitor,
`hsmon extract` and `hsmon online` read there.

    OUT/regenerated.jsonl        the dataset: one line per source row regenerated, in source order, in
                                 the conversation format hsmon extract and SpecForge read
                                 ({"id"?, "conversations": [{"role", "content", "reasoning_content"?}]})
    OUT/hsmon-regenerate.jsonl   the manifest: append-only, fsynced; what counts as done
    OUT/rejects.jsonl            rows not regenerated: {"row", "line", "reason", "class"}
    OUT/.hsmon-regenerate.lock   one writer per output (hsmon.contracts.writer_lock)

Manifest records (one JSON object per line, ``type`` says which):
    {"type": "run", "settings": {...}, "provenance": {...}, "pid", "started", "rows_done", "rows_total",
     "source_tokens_total"}        once per (re)start; ``settings`` bind a resume, ``provenance`` says
                                   what made the answers (model, engine and release, sampling, seed
                                   rule, date)
    {"type": "row", "row": i, "line": n, "end": b, "turns": [{"finish": "stop"|"length", "tokens": n,
     "source_tokens": n|null, "prompt_tokens": n}]}
                                   row i is in the dataset file, which is ``b`` bytes long with it;
                                   ``tokens``: the answer's tokens (its end-of-turn token not counted),
                                   ``source_tokens``: the source answer's (null: the source had none)
    {"type": "reject", "row": i, "reason": "..."}
    {"type": "done" | "stopped", "ts", "rows", "tokens", "rejects", "rejects_by_reason", "seconds"}

Rows and rejects are committed in source order, each once: the dataset file is appended first, its
manifest record second. A resumed run cuts the dataset file back to the last ``row`` record's ``end``
and goes on after the last row or reject recorded, so a row finished out of order under concurrency
is never skipped nor written twice. A ``done`` or ``stopped`` record ends the run whose ``run``
record comes last before it (hsmon.contracts.layout.RunLog).

No heavy imports here: the monitor imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hsmon.contracts import layout
from hsmon.contracts.rejects import classify

DATA_NAME = "regenerated.jsonl"
MANIFEST_NAME = "hsmon-regenerate.jsonl"
REJECTS_NAME = layout.REJECTS_NAME
LOCK_NAME = ".hsmon-regenerate.lock"
FINISH_REASONS = ("stop", "length")
TASK = "regenerate"  # the start event's ``task`` (the job kind the monitor shows)


def is_regeneration(path: str | Path) -> bool:
    """Whether ``path`` is a directory that `hsmon regenerate` wrote to (its manifest is there)."""
    return (Path(path) / MANIFEST_NAME).is_file()


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


@dataclass
class RegenTotals:
    """Running totals of a regeneration's manifest, folded one record at a time (``add``): cost per
    record, flat memory. The plan and the ending are ``runs`` (hsmon.contracts.layout.RunLog)."""

    rows: int = 0
    rejects: int = 0
    reject_classes: dict[str, int] = field(default_factory=dict)
    answers: int = 0  # turns answered
    answer_tokens: int = 0
    compared_answers: int = 0  # answers whose source row had one in the same place
    compared_tokens: int = 0  # their tokens
    source_tokens: int = 0  # the source's answers in those places
    finish: dict[str, int] = field(default_factory=dict)  # finish reason -> answers
    truncated_rows: int = 0  # rows with an answer cut at --max-new-tokens
    last_row: int = -1  # the last row or reject committed
    end: int = 0  # the dataset file's committed length
    runs: layout.RunLog = field(default_factory=layout.RunLog)

    def add(self, record: dict[str, Any]) -> None:
        kind = record.get("type")
        if kind == "row":
            self._row(record)
        elif kind == "reject":
            self.rejects += 1
            key = classify(str(record.get("reason", "")))
            self.reject_classes[key] = self.reject_classes.get(key, 0) + 1
            self.last_row = max(self.last_row, _int(record.get("row")))
        else:
            self.runs.add(record)

    def _row(self, record: dict[str, Any]) -> None:
        self.rows += 1
        self.last_row = max(self.last_row, _int(record.get("row")))
        self.end = max(self.end, _int(record.get("end")))
        cut = False
        turns = record.get("turns")
        for turn in turns if isinstance(turns, list) else ():
            if not isinstance(turn, dict):
                continue
            tokens = _int(turn.get("tokens"))
            finish = turn.get("finish") if turn.get("finish") in FINISH_REASONS else "other"
            self.answers += 1
            self.answer_tokens += tokens
            self.finish[finish] = self.finish.get(finish, 0) + 1
            cut = cut or finish == "length"
            source = turn.get("source_tokens")
            if isinstance(source, int) and not isinstance(source, bool):
                self.compared_answers += 1
                self.compared_tokens += tokens
                self.source_tokens += max(0, source)
        self.truncated_rows += cut

    @property
    def committed(self) -> int:
        """Rows and rejects recorded: the next row to regenerate is the one after ``last_row``."""
        return self.rows + self.rejects

    def mean_answer_tokens(self) -> float | None:
        return self.compared_tokens / self.compared_answers if self.compared_answers else None

    def mean_source_tokens(self) -> float | None:
        return self.source_tokens / self.compared_answers if self.compared_answers else None

    def plan(self) -> dict[str, Any]:
        """rows_total, ending ("done" | "stopped" | None), ending_ts and run_seconds, as
        hsmon.contracts.layout.summarize_runs gives them for an extraction."""
        summary = layout.summarize_runs([self.runs])
        return {key: summary[key] for key in ("rows_total", "ending", "ending_ts", "run_seconds")}


def read_totals(out: str | Path) -> RegenTotals:
    """The totals of ``out``'s manifest, read whole (a resume, a one-shot reader)."""
    totals = RegenTotals()
    for record in layout.iter_jsonl(Path(out) / MANIFEST_NAME):
        totals.add(record)
    return totals


def unfinished_reason(out: str | Path) -> str | None:
    """Why ``out``'s regeneration cannot be read as a finished dataset yet (None: it is done)."""
    totals = read_totals(out)
    plan = totals.plan()
    if plan["ending"] == "done":
        return None
    of = f" of {plan['rows_total']}" if plan["rows_total"] is not None else ""
    how = "stopped" if plan["ending"] == "stopped" else "not finished"
    return f"a regeneration {how} ({totals.committed}{of} rows)"

"""A regeneration's own figures (`hsmon regenerate`): rows done, the answers' tokens and their rate, an
ETA from that rate, why the answers ended, the rows cut at --max-new-tokens and the answers' mean
length against the source's. Read from the output's manifest (hsmon/core/trackers/regen_files.py, read
by the output tracker this tick) or, with only the events file watched, from the cumulative figures
every event of the run carries; the rate from the events' tokens when they are watched, else from
the manifest's growth. A job that is no regeneration has no section."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from hsmon.contracts import regen_layout
from hsmon.contracts.rejects import clean_counts
from hsmon.core.trackers.families import add_sample as _add
from hsmon.core.trackers.families import counter as _c
from hsmon.core.trackers.families import gauge as _g
from hsmon.core.trackers.rates import RateWindow
from hsmon.status_doc import JobStatus, RegenerateSection, regenerate_of


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


class RegenerateTracker:
    """The ``regenerate`` section of one job (``rt``: its hsmon.core.job_runtime.JobRuntime)."""

    name = "regenerate"
    reads_sections = True  # the progress merged this tick (its rows total, its token rate)

    def __init__(self, rt: Any) -> None:
        self.rt = rt
        self._manifest_rate = RateWindow(60.0)

    @classmethod
    def of(cls, rt: Any) -> RegenerateTracker | None:
        return cls(rt) if rt.output is not None or rt.progress is not None else None

    def due(self, now: float) -> bool:
        return True

    def poll(self, now: float) -> None:
        return None  # the output tracker reads the manifest; the progress tracker the events

    def _from_manifest(self, now: float) -> tuple[dict[str, Any], float | None] | None:
        regen = self.rt.output.regen if self.rt.output is not None else None
        if regen is None or regen.read_ts is None:
            return None
        t = regen.totals
        self._manifest_rate.add(now, t.answer_tokens)
        figures = {"rows_done": t.rows, "rejects": t.rejects, "answers": t.answers,
                   "generated_tokens": t.answer_tokens, "finish": dict(t.finish),
                   "truncated_rows": t.truncated_rows,
                   "compared": (t.compared_answers, t.compared_tokens, t.source_tokens),
                   "rows_total": t.plan()["rows_total"], "done": t.plan()["ending"] == "done"}
        return figures, self._manifest_rate.rate()

    def _from_events(self) -> dict[str, Any] | None:
        progress = self.rt.progress
        if progress is None or progress.started_as != regen_layout.TASK:
            return None
        last = next((e for e in reversed(progress.recent) if "answers" in e), None)
        if last is None:
            return {"rows_done": progress.rows_done, "rejects": progress.rejects, "answers": 0,
                    "generated_tokens": progress.tokens_done, "finish": {}, "truncated_rows": 0,
                    "compared": (0, 0, 0), "rows_total": progress.rows_total, "done": False}
        finish = clean_counts(last.get("finish")) or {}
        return {"rows_done": _count(last.get("rows_done")), "rejects": _count(last.get("rejects")),
                "answers": _count(last.get("answers")), "generated_tokens": _count(last.get("tokens_done")),
                "finish": finish, "truncated_rows": _count(last.get("truncated")),
                "compared": tuple(_count(last.get(k)) for k in ("compared_answers", "compared_tokens",
                                                                "source_tokens")),
                "rows_total": progress.rows_total, "done": progress.terminal_kind == "done"}

    def section(self, now: float) -> RegenerateSection | None:
        tick = self.rt.tick
        from_manifest = self._from_manifest(now)
        events = self._from_events()
        if from_manifest is None and events is None:
            return None
        figures, rate = from_manifest if from_manifest is not None else (events, None)
        assert figures is not None
        eta = None if figures["done"] else token_eta(figures, rate)
        if tick.progress is not None and self.rt.progress is not None and self.rt.progress.started:
            # the events' own clock, finer than the manifest's polls; the job's ETA is already by tokens
            # (hsmon/core/eta.py: the run sends its tokens' estimate), one figure everywhere
            rate = tick.progress.tokens_per_s
            eta = 0.0 if figures["done"] else tick.progress.eta_s
            if tick.progress.rows_total is not None:
                figures["rows_total"] = tick.progress.rows_total
        compared, compared_tokens, source = figures["compared"]
        return RegenerateSection(
            rows_done=figures["rows_done"], rows_total=figures["rows_total"], rejects=figures["rejects"],
            answers=figures["answers"], generated_tokens=figures["generated_tokens"], tokens_per_s=rate,
            eta_s=0.0 if figures["done"] else eta, finish=figures["finish"],
            truncated_rows=figures["truncated_rows"],
            mean_answer_tokens=compared_tokens / compared if compared else None,
            mean_source_tokens=source / compared if compared else None,
            source="manifest" if from_manifest is not None else "events")


def token_eta(figures: dict[str, Any], tokens_per_s: float | None) -> float | None:
    """Seconds left at the token rate: the rows left times the tokens a row took so far."""
    done, total = figures["rows_done"], figures["rows_total"]
    if not tokens_per_s or tokens_per_s <= 0 or not done or total is None:
        return None
    return max(0, total - done) * (figures["generated_tokens"] / done) / tokens_per_s


# -- its Prometheus families (hsmon/core/job_trackers.py TRACKER_METRICS; docs/metrics.md) ----------
def metrics(jobs: Sequence[JobStatus], monitor: Any = None) -> Iterator[Any]:
    """A regeneration's rows, tokens, rate, ETA, finish reasons, cut rows and mean lengths."""
    rows = _g("hsmon_regenerate_rows_done", "rows regenerated (committed in source order)")
    planned = _g("hsmon_regenerate_rows_planned", "rows the regeneration will write in all")
    tokens = _c("hsmon_regenerate_generated_tokens_total", "tokens of the answers generated (their "
                "end-of-turn token not counted)")
    rate = _g("hsmon_regenerate_tokens_per_second", "answer tokens generated per second (recent window)")
    eta = _g("hsmon_regenerate_eta_seconds", "seconds left at the token rate")
    answers = _c("hsmon_regenerate_answers_total", "answers generated, by why they ended (stop: an "
                 "end-of-turn token; length: cut at --max-new-tokens)", ("job", "finish"))
    cut = _g("hsmon_regenerate_truncated_rows", "rows with an answer cut at --max-new-tokens")
    mean = _g("hsmon_regenerate_answer_tokens_mean", "mean tokens of an answer that replaced a source answer")
    source = _g("hsmon_regenerate_source_tokens_mean", "mean tokens of the source answers they replaced")
    for job in jobs:
        section = regenerate_of(job)
        if section is None:
            continue
        _add(rows, [job.job], section.rows_done)
        _add(planned, [job.job], section.rows_total)
        _add(tokens, [job.job], section.generated_tokens)
        _add(rate, [job.job], section.tokens_per_s)
        _add(eta, [job.job], section.eta_s)
        for reason in regen_layout.FINISH_REASONS:
            answers.add_metric([job.job, reason], float(section.finish.get(reason, 0)))
        _add(cut, [job.job], section.truncated_rows)
        _add(mean, [job.job], section.mean_answer_tokens)
        _add(source, [job.job], section.mean_source_tokens)
    yield from (rows, planned, tokens, rate, eta, answers, cut, mean, source)

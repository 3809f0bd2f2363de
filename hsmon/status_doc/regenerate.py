"""A regeneration's section (``jobs[].regenerate``): `hsmon regenerate`'s own figures, from its
manifest (hsmon.contracts.regen_layout) or, without the output directory, from its events
(hsmon/core/trackers/regenerate.py measures them)."""

from __future__ import annotations

from typing import Any

from msgspec import UNSET

from hsmon.status_doc.base import Num, Section


class RegenerateSection(Section):
    """Rows committed, the answers' tokens and rate, the ETA from the token rate, why answers ended
    (``finish``: stop = an end-of-turn token, length = cut at --max-new-tokens), the rows with a cut
    answer, and the answers' mean length against the source's (over the answers that replaced one)."""

    rows_done: int
    rows_total: int | None
    rejects: int
    answers: int
    generated_tokens: int
    tokens_per_s: Num | None
    eta_s: Num | None
    finish: dict[str, int]
    truncated_rows: int
    mean_answer_tokens: Num | None
    mean_source_tokens: Num | None
    source: str  # manifest | events: where the figures were read


def regenerate_of(job: Any) -> RegenerateSection | None:
    """A job's regeneration section, or None when it is no regeneration (the field is omitted)."""
    section = getattr(job, "regenerate", UNSET)
    return None if section is UNSET else section

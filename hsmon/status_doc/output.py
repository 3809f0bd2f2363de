"""The ``output`` section: the output directory (hsmon/core/trackers/output_dir.py) and, for the hsmon
layout, the data facts of the hidden states written (hsmon/contracts/data_facts.py) and the engine
check (hsmon/core/verify_watch.py)."""

from __future__ import annotations

from msgspec import UNSET, UnsetType

from hsmon.status_doc.base import Num, Section


class ChunkStats(Section):
    """A layer's figures in the newest complete chunk."""

    mean_l2: Num
    std: Num
    max_abs: Num
    nonfinite: Num
    mean_l2_rest: Num | UnsetType = UNSET  # over positions after the first (the drift figure); added after v1


class LayerReference(Section):
    """The reference chunks' means of a layer."""

    mean_l2: Num
    std: Num
    mean_l2_rest: Num | UnsetType = UNSET  # added after v1


class LayerStats(Section):
    """One layer's statistics over the run, its newest chunk, its reference and recent history."""

    mean_l2: Num
    std: Num
    max_abs: Num
    nonfinite_values: int
    nonfinite_rows: int
    chunk: ChunkStats | None
    reference: LayerReference | None
    history: list[Num]  # mean_l2 of the newest chunks (at most 32), oldest first


class DriftEntry(Section):
    """A chunk whose figure moved beyond the tolerance of the reference chunks."""

    chunk: str
    layer: str
    figure: str  # mean_l2_rest (mean_l2 | std for manifests without it)
    value: Num
    reference: Num


class VerifySection(Section):
    """The engine check of ``hsmon daemon --verify-every`` (docs/daemon.md "Engine check")."""

    verdict: str | None  # agree | disagree | error | timeout | running
    chunk: str | None
    rows_checked: int
    worst_cosine: Num | None
    max_abs_diff: Num | None
    against: str
    checked_ts: float | None
    seconds: Num | None
    reason: str | None
    checks_total: int
    disagreements_total: int
    running_chunk: str | None
    checks_by_verdict: dict[str, int]


class DataSection(Section):
    """``output.data``: what the hidden states written look like."""

    rows: int
    layers: dict[str, LayerStats]
    newest_chunk: str | None
    nonfinite_rows: int
    first_nonfinite_rows: list[int]
    reference_chunks: list[str]
    drift_tolerance: Num
    drifted_chunks: int
    drifts: list[DriftEntry]
    verify: VerifySection | None


class Reading(Section):
    """A large manifest being read on a thread: how far."""

    bytes_done: int
    bytes_total: int


class OutputSection(Section):
    """The output directory. ``rejects``, ``rejects_by_reason`` and ``data`` exist for the hsmon
    layout only; the figures are null while its manifest is read (``reading``)."""

    path: str
    exists: bool
    error: str | None
    layout: str  # hsmon | specforge | speculators | regenerate | empty
    chunks_complete: int | None
    chunks_in_progress: int | None
    rows: int | None
    tokens: int | None
    bytes: int | None
    temp_files: int | None
    reading: Reading | None
    rows_total: int | None
    tokens_total: int | None
    chunks_total: int | None
    ending: str | None  # done | stopped
    ending_ts: float | None
    run_seconds: Num | None
    shards_missing: int
    rejects: int | UnsetType = UNSET
    rejects_by_reason: dict[str, int] | UnsetType = UNSET
    data: DataSection | UnsetType = UNSET

"""The state machine's view of the data itself: hints about NaN/Inf and drifting statistics in the
hidden states written (hsmon/contracts/data_facts.py measures them). Pure, like state.py, which calls
it. These are warnings: bad data does not stop a job, but it must be seen before the training."""

from __future__ import annotations

from hsmon.contracts.data_facts import DataSummary, Drift
from hsmon.core.state_facts import Hint, Snapshot
from hsmon.core.verify_watch import VerifyResult

FIGURE_NAMES = {"mean_l2": "mean L2 norm per token", "std": "std",
                "mean_l2_rest": "mean L2 norm per token after the first position"}


def _rows(rows: tuple[int, ...], total: int) -> str:
    shown = ", ".join(str(r) for r in rows)
    return shown if total <= len(rows) else f"{shown}, ... ({total} rows)"


def _chunk_rows(chunk: str) -> str:
    return chunk.removeprefix("rows_")


def _drift_text(d: Drift, tolerance: float) -> str:
    change = (d.value - d.reference) / d.reference * 100 if d.reference else 0.0
    return (f"{FIGURE_NAMES.get(d.figure, d.figure)} {d.value:.4g} against {d.reference:.4g} in the "
            f"reference chunks ({change:+.0f} %, tolerance ±{tolerance * 100:.0f} %)")


def data_hints(snap: Snapshot) -> list[Hint]:
    """Warnings for non-finite values and for drift in the output's data."""
    data: DataSummary | None = snap.data
    if data is None:
        return verify_hints(snap.verify)
    hints: list[Hint] = []
    if data.nonfinite_rows:
        layers = "; ".join(f"layer {name}: {rows} rows, {values} values"
                           for name, rows, values in data.nonfinite_by_layer)
        hints.append(Hint(
            "data-nonfinite", "warning",
            f"{data.nonfinite_rows} rows of the output hold NaN/Inf hidden states (rows "
            f"{_rows(data.first_nonfinite_rows, data.nonfinite_rows)}; {layers}). hsmon train skips "
            "them; check the target's weights and --dtype (float16 overflows), then re-extract those rows.",
        ))
    if data.drifts:
        newest = data.drifts[-1]
        same = [d for d in data.drifts if d.chunk == newest.chunk]
        first = same[0]
        others = sorted({d.layer for d in same[1:] if d.layer != first.layer})
        also = f"; also layer {', '.join(others)}" if others else ""
        count = f" ({data.drifted_chunks} chunks drifted so far)" if data.drifted_chunks > 1 else ""
        hints.append(Hint(
            "data-drift", "warning",
            f"data drift at rows {_chunk_rows(first.chunk)}, layer {first.layer}: "
            f"{_drift_text(first, data.tolerance)}{also}{count}. Did the target, its weights or the "
            "engine change mid-run? Check with `hsmon verify-data`.",
        ))
    return hints + verify_hints(snap.verify)


def _figure(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def verify_hints(v: VerifyResult | None) -> list[Hint]:
    """The engine check's verdict: DISAGREE is critical (the data written is not what the serving
    engine computes); a check that failed or ran out of time is a warning (it proves nothing)."""
    if v is None or v.verdict in (None, "running"):
        return []
    rows = _chunk_rows(v.chunk or "")
    if v.verdict == "disagree":
        return [Hint(
            "engine-mismatch", "critical",
            f"the data at rows {rows} is not what the engine computes: {v.rows_checked} rows re-extracted by "
            f"{v.against} disagree: {v.reason} (worst cosine {_figure(v.worst_cosine, '.6f')}, max abs diff "
            f"{_figure(v.max_abs_diff, '.3g')}). Do not train on it for this engine: find what changed "
            "(weights, revision, dtype, engine) and re-extract; details: `hsmon verify-data OUT --chunk "
            f"rows_{rows}`.",
        )]
    if v.verdict in ("error", "timeout"):
        what = "failed" if v.verdict == "error" else "ran out of time"
        return [Hint(
            f"verify-{v.verdict}", "warning",
            f"the engine check of rows {rows} against {v.against} {what}: {v.reason}. The data is not "
            "checked (nothing is known to be wrong with it); the next check runs after the next chunks.",
        )]
    if v.disagreements_total:
        return [Hint(
            "engine-mismatch-earlier", "warning",
            f"{v.disagreements_total} of {v.checks_total} engine checks disagreed earlier; the latest "
            f"(rows {rows}) agrees: re-check the chunks written before it with `hsmon verify-data`.",
        )]
    return []

"""The output directory tracker's Prometheus families (hsmon/core/trackers/output_dir.py's ``output``
section: its counts, the data facts of hsmon/contracts/data_facts.py and the engine check of
hsmon/core/verify_watch.py), read from the status document at scrape time. Listed in
hsmon/core/job_trackers.py TRACKER_METRICS; documented in docs/metrics.md."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from hsmon.core.trackers.families import add_sample as _add
from hsmon.core.trackers.families import counter as _c
from hsmon.core.trackers.families import gauge as _g
from hsmon.status_doc import DataSection, JobStatus


def metrics(jobs: Sequence[JobStatus], monitor: Any = None) -> Iterator[Any]:
    """The output directory's families (the ``output`` section, its data facts and engine check)."""
    fams = {
        "chunks_complete": _g("hsmon_output_chunks_complete", "complete chunks in the output directory"),
        "chunks_in_progress": _g("hsmon_output_chunks_in_progress", "chunks being written"),
        "rows": _g("hsmon_output_rows", "rows in the output directory"),
        "tokens": _g("hsmon_output_tokens", "tokens in the output directory (when known)"),
        "bytes": _g("hsmon_output_bytes", "bytes of complete rows in the output directory"),
        "temp_files": _g("hsmon_output_temp_files", "files still being written (hidden temporaries)"),
    }
    for job in jobs:
        out = job.output
        if not out:
            continue
        for key, fam in fams.items():
            _add(fam, [job.job], getattr(out, key))
    yield from fams.values()
    yield from _data_facts(jobs)


def _data_facts(jobs: Sequence[JobStatus]) -> Iterator[Any]:
    """Per-layer statistics of the hidden states written (output.data, hsmon/contracts/data_facts.py)."""
    by_layer = ("job", "layer")
    run = {
        "mean_l2": _g("hsmon_output_layer_mean_l2_norm", "mean L2 norm per token of the layer's "
                      "hidden states, over the run", by_layer),
        "std": _g("hsmon_output_layer_std", "std of the layer's values, over the run", by_layer),
        "max_abs": _g("hsmon_output_layer_max_abs", "largest finite |x| of the layer", by_layer),
        "nonfinite_values": _g("hsmon_output_layer_nonfinite_values", "NaN/Inf values of the layer",
                               by_layer),
        "nonfinite_rows": _g("hsmon_output_layer_nonfinite_rows", "rows with NaN/Inf in the layer",
                             by_layer),
    }
    chunk = {
        "mean_l2": _g("hsmon_output_layer_chunk_mean_l2_norm", "mean L2 norm per token in the newest "
                      "complete chunk", by_layer),
        "std": _g("hsmon_output_layer_chunk_std", "std in the newest complete chunk", by_layer),
    }
    ratio = _g("hsmon_output_layer_chunk_drift_ratio", "newest chunk's mean L2 norm (after the first "
               "position) over the reference chunks' (1 = no drift)", by_layer)
    rows = _g("hsmon_output_nonfinite_rows", "rows whose hidden states hold NaN/Inf (any layer)")
    drifted = _g("hsmon_output_drifted_chunks", "chunks whose statistics moved beyond the drift tolerance")
    for job in jobs:
        data = _data(job)
        if data is None:
            continue
        name = job.job
        _add(rows, [name], data.nonfinite_rows)
        _add(drifted, [name], data.drifted_chunks)
        for layer, facts in data.layers.items():
            for key, fam in run.items():
                _add(fam, [name, layer], getattr(facts, key))
            newest, ref = facts.chunk, facts.reference
            for key, fam in chunk.items():
                _add(fam, [name, layer], getattr(newest, key) if newest else None)
            if newest is not None and ref is not None:  # the drift figure's ratio (contracts/data_facts.py)
                if newest.mean_l2_rest and ref.mean_l2_rest:
                    ratio.add_metric([name, layer], newest.mean_l2_rest / ref.mean_l2_rest)
                elif newest.mean_l2 is not None and ref.mean_l2:
                    ratio.add_metric([name, layer], newest.mean_l2 / ref.mean_l2)
    yield from (*run.values(), *chunk.values(), ratio, rows, drifted)
    yield from _verify(jobs)


def _verify(jobs: Sequence[JobStatus]) -> Iterator[Any]:
    """The engine check during the run (output.data.verify, hsmon/core/verify_watch.py)."""
    checks = _c("hsmon_verify_checks_total", "engine checks finished, by verdict (agree, disagree, error, "
                "timeout)", ("job", "verdict"))
    cosine = _g("hsmon_verify_worst_cosine", "lowest per-token cosine of the last engine check (1 = equal)")
    diff = _g("hsmon_verify_max_abs_diff", "largest absolute difference of the last engine check")
    last = _g("hsmon_verify_last_timestamp_seconds", "when the last engine check finished")
    disagree = _g("hsmon_verify_disagree", "1 when the last engine check disagreed with the data, else 0")
    for job in jobs:
        data = _data(job)
        v = data.verify if data is not None else None
        if not v:
            continue
        name = job.job
        for verdict in ("agree", "disagree", "error", "timeout"):
            checks.add_metric([name, verdict], v.checks_by_verdict.get(verdict, 0))
        _add(cosine, [name], v.worst_cosine)
        _add(diff, [name], v.max_abs_diff)
        _add(last, [name], v.checked_ts)
        disagree.add_metric([name], 1.0 if v.verdict == "disagree" else 0.0)
    yield from (checks, cosine, diff, last, disagree)


def _data(job: JobStatus) -> DataSection | None:
    """The job's ``output.data`` (hsmon layout only), or None."""
    data = job.output.data if job.output is not None else None
    return data if isinstance(data, DataSection) else None

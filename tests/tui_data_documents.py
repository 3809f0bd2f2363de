"""The demo's finished extraction (tests/tui_run_documents.py) with the data facts a daemon publishes
for it (`output.data`, docs/status-api.md; `verify` as the status API names it): a clean run whose
engine check agreed, and a run with NaN rows whose engine check disagreed. For the data panel's tests.

The norms are those of the embedded target's layers 2, 4, 5 and final on the demo's rows (12-18 per
token, chunk to chunk within a few %), as hsmon/contracts/data_facts.py computes them.
"""

from __future__ import annotations

import copy
from typing import Any

import tui_run_documents as run

LAYERS = {"2": 13.02, "4": 15.71, "5": 16.4, "final": 12.2}
WOBBLE = (1.0, 1.013, 0.991, 1.024, 0.987, 1.006, 0.979, 1.031, 0.996, 1.011)


def data_section(bad: bool, verify: dict[str, Any] | None) -> dict[str, Any]:
    """``output.data`` after 10 chunks; ``bad``: rows 3 and 9 hold NaN in every layer."""
    layers = {}
    for name, norm in LAYERS.items():
        history = [round(norm * w, 4) for w in WOBBLE]
        layers[name] = {
            "mean_l2": norm, "std": norm / 11.3, "max_abs": norm * 0.7,
            "nonfinite_values": 128 if bad else 0, "nonfinite_rows": 2 if bad else 0,
            "chunk": {"mean_l2": history[-1], "std": norm / 11.2, "max_abs": norm * 0.6,
                      "nonfinite": 64 if bad else 0},
            "reference": {"mean_l2": norm * 1.001, "std": norm / 11.3},
            "history": history,
        }
    return {"rows": 300, "layers": layers, "newest_chunk": "rows_270-300",
            "nonfinite_rows": 2 if bad else 0, "first_nonfinite_rows": [3, 9] if bad else [],
            "reference_chunks": ["rows_0-30", "rows_30-60", "rows_60-90"], "drift_tolerance": 0.25,
            "drifted_chunks": 0, "drifts": [], "verify": verify}


AGREE = {"verdict": "agree", "chunk": "rows_270-300", "rows_checked": 4, "worst_cosine": 0.99999213,
         "max_abs_diff": 0.000312, "against": "http://127.0.0.1:30000", "checked_ts": run.T0 + 17.2,
         "seconds": 1.84, "reason": None, "checks_total": 10, "disagreements_total": 0,
         "running_chunk": None, "checks_by_verdict": {"agree": 10}}
DISAGREE = AGREE | {"verdict": "disagree", "worst_cosine": 0.8123, "max_abs_diff": 4.75,
                    "reason": "layers 5, final differ: cosine 0.8123 < 0.999", "disagreements_total": 3,
                    "checks_by_verdict": {"agree": 7, "disagree": 3}}


def documents(bad: bool, verify: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The finished extraction's documents, each with the data facts."""
    docs = copy.deepcopy(run.finished_extraction())
    for doc in docs:
        job = doc["jobs"][0]
        job["output"]["data"] = data_section(bad, verify)
        if bad:
            job["hints"] = [
                {"id": "data-nonfinite", "severity": "warning",
                 "message": "2 rows of the output hold NaN/Inf hidden states "
                            "(rows 3, 9; layer final: 2 rows)"},
                {"id": "engine-mismatch", "severity": "critical",
                 "message": "the engine's hidden states of rows_270-300 disagree with the reference"},
            ]
    return docs

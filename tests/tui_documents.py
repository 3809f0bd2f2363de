"""Fixed status documents (docs/status-api.md) for the TUI's pilot and snapshot tests.

Times are frozen: every document carries its own ``generated_ts`` and the TUI derives every age
and duration from the document, so the screens are the same on every run.
"""

from __future__ import annotations

import copy
from typing import Any

T0 = 1764489600.0


def extraction_job(step: int = 0, out: str = "/data/out", model: str = "/models/target") -> dict[str, Any]:
    """An extraction a quarter done, silent with the stdout-buffering hint, /dev/shm tight."""
    now = T0 + step
    return {
        "job": "extract",
        "kind": "extract",
        "state": "silent",
        "state_since_ts": T0 - 300,
        "reason": "dump files and CPU time move, but no progress event for 240s",
        "hints": [
            {
                "id": "stdout-buffered",
                "severity": "warning",
                "message": "stdout goes to /var/log/x.log without PYTHONUNBUFFERED: run with "
                "python -u or PYTHONUNBUFFERED=1",
            }
        ],
        "transitions_total": 3,
        "progress": {
            "rows_done": 2500 + step * 10,
            "rows_total": 10000,
            "tokens_done": 5_250_000 + step * 21000,
            "tokens_total": 21_000_000,
            "chunks_done": 1,
            "chunks_total": 5,
            "rejects": 2,
            "rows_per_s": 1.5 + (step % 3) * 0.2,
            "tokens_per_s": 3100.0 + step * 50,
            "bytes_per_s": 1.3e8 + step * 1e7,
            "elapsed_s": 5400.0 + step,
            "eta_s": 16200.0 - step,
            "last_progress_ts": now - 240,
        },
        "dump": {
            "path": "/dev/shm/sglang_hs",
            "exists": True,
            "files": 12 + step % 4,
            "bytes": 1_200_000_000,
            "oldest_age_s": 3.2,
            "created_total": 900,
            "consumed_total": 888,
            "created_per_s": 1.4,
            "consumed_per_s": 1.4,
        },
        "output": {
            "path": out,
            "exists": True,
            "layout": "hsmon",
            "chunks_complete": 1,
            "chunks_in_progress": 1,
            "rows": 2500,
            "tokens": 5_250_000,
            "bytes": 2.2e11,
            "temp_files": 1,
        },
        "disk": [
            {
                "role": "output",
                "path": "/data",
                "free_bytes": 8e11,
                "total_bytes": 2e12,
                "needed_bytes": 6.6e11,
                "fits": True,
                "write_bytes_per_s": 1.3e8,
                "time_to_full_s": 6100.0,
                "time_to_done_s": 16200.0,
            },
            {
                "role": "shm",
                "path": "/dev/shm",
                "free_bytes": 2e9,
                "total_bytes": 6.4e10,
                "needed_bytes": 4e9,
                "fits": False,
                "write_bytes_per_s": 1.4e6,
                "time_to_full_s": 1400.0,
                "time_to_done_s": 16200.0,
            },
        ],
        "processes": [
            {
                "role": "extractor",
                "pid": 4242,
                "alive": True,
                "status": "running",
                "cpu_seconds": 812.5,
                "cpu_percent": 97.0,
                "rss_bytes": 2.1e9,
                "threads": 9,
                "start_ts": T0 - 5400,
                "uptime_s": 5400.0,
                "restarts": 0,
                "cmdline": "python pack.py",
                "stdout": "/var/log/x.log",
                "stdout_buffered": True,
            },
            {
                "role": "server",
                "pid": 4200,
                "alive": True,
                "status": "sleeping",
                "cpu_seconds": 9000.0,
                "cpu_percent": 310.0,
                "rss_bytes": 6.5e10,
                "threads": 80,
                "start_ts": T0 - 7200,
                "uptime_s": 7200.0,
                "restarts": 1,
            },
        ],
        "events": {
            "path": f"{out}/events.jsonl",
            "exists": True,
            "lines": 900,
            "bad_lines": 0,
            "last_event_ts": now - 240,
            "last_kind": "reject",
        },
        "recent_events": [
            {
                "v": 1,
                "ts": T0 - 900,
                "job": "extract",
                "kind": "start",
                "rows": 10000,
                "model": model,
                "output_dir": out,
            },
            {
                "v": 1,
                "ts": T0 - 600,
                "job": "extract",
                "kind": "chunk",
                "chunk": "rows_0-2000",
                "rows": 2000,
            },
            {
                "v": 1,
                "ts": T0 - 500,
                "job": "extract",
                "kind": "reject",
                "row": 2101,
                "reason": "empty text",
            },
            {
                "v": 1,
                "ts": T0 - 400,
                "job": "extract",
                "kind": "retry",
                "row": 2200,
                "attempt": 1,
                "error": "server 503",
            },
            {"v": 1, "ts": T0 - 300, "job": "extract", "kind": "state", "from": "running", "to": "silent"},
            {"v": 1, "ts": T0 - 240, "job": "extract", "kind": "reject", "row": 2417, "reason": "too long"},
        ],
        "training": None,
    }


def training_job(step: int = 0) -> dict[str, Any]:
    """A drafter training some steps in, with 7 unroll steps of loss and accuracy."""
    now = T0 + step
    k = 40 + step * 10
    return {
        "job": "train",
        "kind": "train",
        "state": "running",
        "state_since_ts": T0 - 100,
        "reason": "step events arrive",
        "hints": [],
        "transitions_total": 1,
        "progress": {"rows_done": None, "rows_total": None, "elapsed_s": 100.0 + step, "eta_s": 300.0 - step},
        "dump": None,
        "output": None,
        "disk": [],
        "processes": [
            {
                "role": "trainer",
                "pid": 5151,
                "alive": True,
                "status": "running",
                "cpu_percent": 180.0,
                "rss_bytes": 3e9,
                "uptime_s": 100.0 + step,
                "restarts": 0,
            }
        ],
        "events": {
            "path": "/data/out-drafter/events.jsonl",
            "exists": True,
            "lines": 10,
            "bad_lines": 0,
            "last_event_ts": now - 1,
            "last_kind": "step",
        },
        "recent_events": [{"v": 1, "ts": now - 1, "job": "train", "kind": "step", "step": k}],
        "training": {
            "step": k,
            "epoch": 0,
            "loss": [round(2.0 + 0.3 * i - 0.05 * step, 3) for i in range(7)],
            "acc": [round(0.6 - 0.07 * i + 0.02 * step, 3) for i in range(7)],
            "tokens_per_s": 900.0 + step,
            "last_checkpoint": "/data/out-drafter/ckpt-40",
            "eta_s": 300.0 - step,
        },
    }


def document(step: int = 0, training: bool = True, **paths: str) -> dict[str, Any]:
    jobs = [extraction_job(step, **paths)]
    if training:
        jobs.append(training_job(step))
    return {
        "v": 1,
        "generated_ts": T0 + step,
        "daemon": {"version": "0.1.0", "pid": 1234, "started_ts": T0 - 8000, "source": "daemon"},
        "jobs": copy.deepcopy(jobs),
    }


def documents(count: int = 12, training: bool = True, **paths: str) -> list[dict[str, Any]]:
    """A short history, so sparklines have a shape."""
    return [document(step, training, **paths) for step in range(count)]

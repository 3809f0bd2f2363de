"""Status documents of a whole small run, as the daemon publishes them during `make demo`: an
extraction running, the same extraction finished (its history behind it), and a finished drafter
training beside a finished `hsmon eval-drafter`. For the TUI's snapshot tests.

Figures carry the full float precision a real document has (rates like 26.123456789), so a
screen that prints them unformatted shows. Times are frozen: every age derives from the document.
"""

from __future__ import annotations

import copy
from typing import Any

T0 = 1764489600.0
OUT = "/tmp/hsmon-tui-snapshot/a-rather-long-directory-name/demo-out/extract"
DRAFTER = "/tmp/hsmon-tui-snapshot/a-rather-long-directory-name/demo-out/drafter"
ROWS, TOKENS, CHUNK = 300, 34662, 100
RUN_SECONDS = 12  # the extraction's length
ACCS = [
    0.26489531993865967,
    0.22093217372894287,
    0.2031846046447754,
    0.19412314891815186,
    0.2011345624923706,
    0.19211745262145996,
    0.19034719467163086,
]
LOSSES = [
    5.443658351898193,
    5.485819339752197,
    5.512345671653748,
    5.601234555244446,
    5.599876642227173,
    5.634567379951477,
    5.678901195526123,
]


def _ev(t: float, kind: str, job: str = "extract", **fields: Any) -> dict[str, Any]:
    return {"v": 1, "ts": T0 + t, "job": job, "kind": kind, **fields}


def _rows_done(t: float) -> int:
    return min(ROWS, int(ROWS * t / RUN_SECONDS))


def extraction(t: float) -> dict[str, Any]:
    """The demo's extraction ``t`` seconds after its start (done from RUN_SECONDS on)."""
    done = t >= RUN_SECONDS
    rows = _rows_done(t)
    tokens = int(TOKENS * rows / ROWS)
    events = [
        _ev(
            0.0,
            "start",
            rows_total=ROWS,
            tokens_total=TOKENS,
            rows_done=0,
            tokens_done=0,
            chunks_total=3,
            chunks_done=0,
            layers=[2, 4, 5],
            out_dir=OUT,
            pid=4242,
            backend="hf",
            model="embedded",
            bytes_needed=72_200_000,
        )
    ]
    for second in range(1, int(min(t, RUN_SECONDS)) + 1):
        r = _rows_done(second)
        events.append(
            _ev(
                second - 0.5,
                "heartbeat",
                rows_done=r,
                rows_total=ROWS,
                tokens_done=r * 115,
                tokens_total=TOKENS,
                bytes_done=r * 240_000,
                rejects=0,
                chunks_done=r // CHUNK,
                paused=None,
            )
        )
        events.append(
            _ev(
                second,
                "rows",
                rows=25,
                tokens=2157,
                last_row=r - 1,
                rows_done=r,
                rows_total=ROWS,
                tokens_done=int(TOKENS * r / ROWS),
                tokens_total=TOKENS,
                bytes_done=r * 240_000,
            )
        )
        if r % CHUNK < 25 and r >= CHUNK:
            events.append(
                _ev(
                    second + 0.01,
                    "chunk",
                    chunk=f"rows_{r // CHUNK * CHUNK - CHUNK}-{r // CHUNK * CHUNK}",
                    rows=100,
                    tokens=11554,
                    bytes=24_066_667,
                    rejects=0,
                    sha256="ab" * 32,
                )
            )
    events.append(_ev(0.8, "state", state="running", previous="starting", reason="progress events arrive"))
    if done:
        events.append(
            _ev(
                RUN_SECONDS,
                "done",
                seconds=11.482913017272949,
                out_dir=OUT,
                rows_done=ROWS,
                rows_total=ROWS,
                tokens_done=TOKENS,
                tokens_total=TOKENS,
                bytes_done=72_200_000,
                rejects=0,
                chunks_done=3,
                paused=None,
            )
        )
        events.append(
            _ev(RUN_SECONDS + 0.9, "state", state="done", previous="running", reason="the job reported done")
        )
    events.sort(key=lambda e: e["ts"])
    rate = 0.0 if done else ROWS / RUN_SECONDS * (1 + 0.1 * ((int(t) % 3) - 1)) + 0.123456789
    elapsed = min(t, RUN_SECONDS)
    return {
        "job": "extract",
        "kind": "extract",
        "state": "done" if done else "running",
        "state_since_ts": T0 + (RUN_SECONDS + 0.9 if done else 0.8),
        "reason": "the job reported done" if done else "progress events arrive",
        "hints": [],
        "transitions_total": 2 if done else 1,
        "progress": {
            "rows_done": rows,
            "rows_total": ROWS,
            "tokens_done": tokens,
            "tokens_total": TOKENS,
            "chunks_done": rows // CHUNK,
            "chunks_total": 3,
            "rejects": 0,
            "rows_per_s": rate,
            "tokens_per_s": rate * 115.54,
            "bytes_per_s": rate * 240_000.0,
            "elapsed_s": elapsed + 0.123456,
            "eta_s": 0.0 if done else (ROWS - rows) / (ROWS / RUN_SECONDS),
            "last_progress_ts": T0 + elapsed,
        },
        "dump": None,
        "output": {
            "path": OUT,
            "exists": True,
            "layout": "hsmon",
            "chunks_complete": rows // CHUNK,
            "chunks_in_progress": 0 if done else 1,
            "rows": rows,
            "tokens": tokens,
            "bytes": rows * 240_000.0,
            "temp_files": 0,
        },
        "disk": [
            {
                "role": "output",
                "path": OUT,
                "free_bytes": 75_412_345_679,
                "total_bytes": 2e11,
                "needed_bytes": 0.0 if done else (ROWS - rows) * 240_000.0,
                "fits": True,
                "write_bytes_per_s": rate * 240_000.0,
                "time_to_full_s": None if done else 1e6,
                "time_to_done_s": 0.0 if done else (ROWS - rows) / (ROWS / RUN_SECONDS),
            }
        ],
        "processes": [
            {
                "role": "extractor",
                "pid": 4242,
                "alive": not done,
                "status": "gone" if done else "running",
                "cpu_percent": None if done else 99.87654,
                "rss_bytes": None if done else 1.234567e9,
                "uptime_s": None if done else elapsed,
                "restarts": 0,
            }
        ],
        "events": {
            "path": f"{OUT}/../events.jsonl",
            "exists": True,
            "lines": len(events),
            "bad_lines": 0,
            "last_event_ts": events[-1]["ts"],
            "last_kind": events[-1]["kind"],
        },
        "recent_events": events[-20:],
        "training": None,
    }


def training(done: bool = True) -> dict[str, Any]:
    """The demo's drafter training, finished by its time limit at step 74 of 76."""
    start, end = RUN_SECONDS + 2, RUN_SECONDS + 64
    evaluation = {
        "step": 74,
        "rows": 16,
        "losses": LOSSES,
        "accs": ACCS,
        "loss": 21.76234817504883,
        "accept_len_est": 1.3370041847229004,
    }
    events = [
        _ev(
            start,
            "start",
            "train-drafter",
            backend="train",
            pid=5151,
            output_dir=DRAFTER,
            data_dir=OUT,
            total_rows=284,
            eval_rows=16,
            total_tokens=32811,
            ttt_length=7,
            total_steps=76,
        ),
        _ev(end - 6, "heartbeat", "train-drafter", step=70, tokens=121_660, epoch=3),
        _ev(
            end - 4,
            "step",
            "train-drafter",
            step=72,
            total_steps=76,
            epoch=3,
            loss=21.812345678,
            losses=LOSSES,
            accs=ACCS,
            lr=0.0001234567,
            grad_norm=1.23456789,
            tokens=125_139,
            tokens_s=2119.87654321,
            data_wait_frac=0.01234567,
        ),
        _ev(end - 2, "checkpoint", "train-drafter", step=74, path=f"{DRAFTER}/checkpoint-74", epoch=3),
        _ev(end - 1, "eval", "train-drafter", **evaluation),
        _ev(
            end,
            "done",
            "train-drafter",
            step=74,
            tokens=128_617,
            epochs_done=3,
            time_limit_reached=True,
            eval_accs=ACCS,
            ranks_in_sync=True,
            checkpoint=f"{DRAFTER}/checkpoint-74",
        ),
        _ev(
            end + 0.5,
            "state",
            "train-drafter",
            state="done",
            previous="running",
            reason="the job reported done",
        ),
    ]
    return {
        "job": "train-drafter",
        "kind": "train",
        "state": "done",
        "state_since_ts": T0 + end + 0.5,
        "reason": "the job reported done",
        "hints": [],
        "transitions_total": 2,
        "progress": {
            "rows_done": 0,
            "rows_total": 284,
            "tokens_done": 128_617,
            "tokens_total": None,
            "chunks_done": 0,
            "chunks_total": None,
            "rejects": 0,
            "rows_per_s": 0.0,
            "tokens_per_s": 2074.4677419354839,
            "bytes_per_s": 0.0,
            "elapsed_s": 62.00123,
            "eta_s": 0.0,
            "last_progress_ts": T0 + end,
        },
        "dump": None,
        "output": None,
        "disk": [],
        "processes": [{"role": "trainer", "pid": 5151, "alive": False, "status": "gone", "restarts": 0}],
        "events": {
            "path": f"{DRAFTER}/events.jsonl",
            "exists": True,
            "lines": 90,
            "bad_lines": 0,
            "last_event_ts": T0 + end,
            "last_kind": "done",
        },
        "recent_events": events,
        "training": {
            "step": 74,
            "epoch": 3,
            "total_steps": 76,
            "loss": LOSSES,
            "acc": ACCS,
            "loss_weighted": 21.812345678,
            "lr": 0.0001234567,
            "grad_norm": 1.23456789,
            "data_wait_frac": 0.01234567,
            "tokens_per_s": 2119.87654321,
            "last_checkpoint": f"{DRAFTER}/checkpoint-74",
            "eta_s": 1.4567,
            "eval": evaluation,
        },
    }


def training_history(step: int) -> dict[str, Any]:
    """The training ``step`` log intervals in: falling loss, rising accuracy."""
    job = copy.deepcopy(training())
    job["state"], job["reason"] = "running", "step events arrive"
    f = step / 10
    job["training"].update(
        step=step * 8,
        loss=[v + 2.5 * (1 - f) for v in LOSSES],
        acc=[a * (0.3 + 0.7 * f) for a in ACCS],
        eval=None,
    )
    return job


def acceptance(t: float, done: bool = True) -> dict[str, Any]:
    """`hsmon eval-drafter` as the demo runs it, finished (or ``t`` seconds in)."""
    start = RUN_SECONDS + 66
    total = 60
    decodes = total if done else int(total * t / 24)
    result = {
        "acceptance_length": {
            "eagle3": {
                str(d): v
                for d, v in enumerate((1.5555555, 1.9012, 2.1234567, 2.2456, 2.3012, 2.35, 2.3770491803), 1)
            },
            "ngram": {
                str(d): v for d, v in enumerate((1.8656716, 2.9, 3.6012, 4.1, 4.5, 4.7, 4.8846153846), 1)
            },
        },
        "prompts": 4,
        "max_new_tokens": 32,
        "outputs_match_greedy": True,
    }
    events = [
        _ev(
            start,
            "start",
            "eval-drafter",
            backend="eval-drafter",
            pid=6161,
            drafter=DRAFTER,
            prompts=4,
            depth=7,
            rows_total=total,
        )
    ]
    events += [
        _ev(start + i, "rows", "eval-drafter", rows=4, rows_done=min(4 * i, decodes), rows_total=total)
        for i in range(1, decodes // 4 + 1)
    ][-12:]
    if done:
        events += [
            _ev(start + 23, "eval", "eval-drafter", **result),
            _ev(start + 23.1, "done", "eval-drafter", seconds=23.2, **result),
        ]
    return {
        "job": "eval-drafter",
        "kind": "external",
        "state": "done" if done else "running",
        "state_since_ts": T0 + start + 23.5,
        "reason": "the job reported done" if done else "progress events arrive",
        "hints": [],
        "transitions_total": 2,
        "progress": {
            "rows_done": decodes,
            "rows_total": total,
            "tokens_done": 0,
            "tokens_total": None,
            "chunks_done": 0,
            "chunks_total": None,
            "rejects": 0,
            "rows_per_s": 2.5,
            "tokens_per_s": 0.0,
            "bytes_per_s": 0.0,
            "elapsed_s": 23.1 if done else t,
            "eta_s": 0.0 if done else (total - decodes) / 2.5,
            "last_progress_ts": T0 + start + t,
        },
        "dump": None,
        "output": None,
        "disk": [],
        "processes": [
            {
                "role": "extractor",
                "pid": 6161,
                "alive": not done,
                "status": "gone" if done else "running",
                "restarts": 0,
            }
        ],
        "events": {
            "path": "/tmp/eval-events.jsonl",
            "exists": True,
            "lines": len(events),
            "bad_lines": 0,
            "last_event_ts": events[-1]["ts"],
            "last_kind": events[-1]["kind"],
        },
        "recent_events": events,
        "training": {
            "step": None,
            "epoch": None,
            "loss": None,
            "acc": None,
            "tokens_per_s": None,
            "last_checkpoint": None,
            "eta_s": None,
            "eval": result,
        }
        if done
        else None,
    }


def doc(t: float, *jobs: dict[str, Any]) -> dict[str, Any]:
    return {
        "v": 1,
        "generated_ts": T0 + t,
        "daemon": {"version": "0.1.0", "pid": 1234, "started_ts": T0 - 5, "source": "daemon"},
        "jobs": copy.deepcopy(list(jobs)),
    }


def running_extraction() -> list[dict[str, Any]]:
    """Eight seconds of the extraction, one document a second."""
    return [doc(t + 0.25, extraction(t + 0.25)) for t in range(8)]


def finished_extraction() -> list[dict[str, Any]]:
    """The whole extraction and a while after its done (rates fall to zero then)."""
    return [doc(t + 0.25, extraction(t + 0.25)) for t in range(RUN_SECONDS + 6)]


def finished_training() -> list[dict[str, Any]]:
    """The extraction done, the training's steps, then the training and the eval-drafter done."""
    end = RUN_SECONDS + 64
    docs = [
        doc(RUN_SECONDS + 2 + 6 * i, extraction(RUN_SECONDS + 1), training_history(i)) for i in range(1, 10)
    ]
    docs.append(doc(end + 1, extraction(RUN_SECONDS + 1), training()))
    docs.append(doc(end + 12, extraction(RUN_SECONDS + 1), training(), acceptance(10, done=False)))
    docs.append(doc(end + 26, extraction(RUN_SECONDS + 1), training(), acceptance(24)))
    return docs

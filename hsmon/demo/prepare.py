"""The demo's set-up, run in a child process (it imports torch): the target model, the sample dataset
and the held-out eval prompts; and, per target, the constants of the demo's training and eval.

The rows and the prompts are of one kind, the kind the embedded target was trained on: a user asks
"Write a Python function `name`: <first paragraph of its docstring>" and the assistant answers with
the function's source. Rows come from standard-library files (`extractor.target_text.DEMO_SOURCES`);
the held-out prompts ask for functions of files that neither the sample nor the embedded target's
corpus contains (`HELD_OUT_PROMPTS`), chosen among those the embedded target answers without falling
into a loop within the eval's tokens (several others it answers `def _get_f_f_f_f...`, which flatters
the n-gram drafter and says nothing about the EAGLE-3 one; see docs/tui.md).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# (file of the standard library, function): held out from the sample and the embedded target's corpus
HELD_OUT_PROMPTS = (
    ("hmac.py", "update"),
    ("sched.py", "cancel"),
    ("symtable.py", "symtable"),
    ("hmac.py", "hexdigest"),
)
EVAL_DEPTH = 7
ROWS_ENV = "HSMON_DEMO_ROWS"
EVAL_PROMPTS = len(HELD_OUT_PROMPTS)  # the most held-out prompts there are


@dataclass(frozen=True)
class Profile:
    """What the demo does with one target: rows, training settings, eval size."""

    rows: int
    max_answer_chars: int
    eval_prompts: int
    eval_new_tokens: int
    # A short training that still learns something on the demo's rows: `hsmon train`'s defaults
    # (lr 2e-3, 4 epochs) with half-size batches (twice the steps) and a fixed draft vocabulary
    # (see docs/benchmarks.md, "Defaults" and "Training and acceptance").
    train_fields: dict[str, str] = field(default_factory=dict)


PROFILES = {
    "embedded": Profile(
        rows=300,
        max_answer_chars=600,
        eval_prompts=4,
        eval_new_tokens=32,
        train_fields={
            "epochs": "4",  # about 50 s on 2 cores; the time limit caps it on a slower machine
            "lr": "2e-3",
            "batch_tokens": "2048",
            "draft_vocab_size": "1024",
            "threads": "1",
        },
    ),
    # A real 135 M-parameter model: fewer, shorter rows; its 49k vocabulary gets a larger draft one.
    "smollm2": Profile(
        rows=64,
        max_answer_chars=400,
        eval_prompts=3,
        eval_new_tokens=24,
        train_fields={
            "epochs": "4",
            "lr": "2e-3",
            "batch_tokens": "2048",
            "draft_vocab_size": "2048",
            "threads": "1",
        },
    ),
}


def function_rows(sources: tuple[str, ...], max_chars: int) -> list[tuple[str, str, str]]:
    """(name, request, source) of documented functions in standard-library ``sources``, in order."""
    from extractor.target_text import function_requests, stdlib_dir

    return list(function_requests([stdlib_dir() / name for name in sources], max_chars))


def heldout_messages(count: int) -> list[list[dict[str, str]]]:
    """The held-out prompts as conversations: the user's request, answered by the eval's target."""
    from extractor.target_text import function_requests, stdlib_dir

    messages = []
    for source, wanted in HELD_OUT_PROMPTS[:count]:
        found = next((r for n, r, _ in function_requests([stdlib_dir() / source]) if n == wanted), None)
        if found is None:  # another Python version without that function: a clear failure, not a gap
            raise RuntimeError(f"no documented function {wanted} in the standard library's {source}")
        messages.append([{"role": "user", "content": found}])
    return messages


def sample_rows(profile: Profile) -> int:
    """The sample's rows: the profile's, fewer under HSMON_DEMO_ROWS (tests only: a short extraction
    before the phase they stop)."""
    return min(profile.rows, int(os.environ.get(ROWS_ENV) or profile.rows))


def prepare(base: Path, model: str = "embedded") -> dict[str, Any]:
    """(In the child) the target model, the sample dataset and the held-out eval prompts."""
    from extractor.target_text import DEMO_SOURCES
    from extractor.targets import resolve_model

    profile = PROFILES[model]
    base.mkdir(parents=True, exist_ok=True)
    model_dir = resolve_model(model)
    data = base / "sample.jsonl"
    rows = function_rows(DEMO_SOURCES, profile.max_answer_chars)[: sample_rows(profile)]
    with open(data, "w", encoding="utf-8") as fh:
        for _, request, code in rows:
            messages = [{"role": "user", "content": request}, {"role": "assistant", "content": code}]
            fh.write(json.dumps({"messages": messages}) + "\n")
    prompts = base / "heldout-prompts.jsonl"
    held = heldout_messages(profile.eval_prompts)
    with open(prompts, "w", encoding="utf-8") as fh:
        for messages in held:
            fh.write(json.dumps({"messages": messages}) + "\n")
    return {
        "model": str(model_dir),
        "preset": model,
        "data": str(data),
        "rows": len(rows),
        "prompts": str(prompts),
        "eval_prompts": len(held),
    }

"""The demo's set-up, run in a child process (it imports torch): the target model, the sample dataset
and the held-out eval prompts; and the constants of the demo's training and eval."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Standard-library files that neither the sample dataset (extractor.demo.SOURCES) nor the embedded
# target's corpus (CRC-32 of the name = 0 mod 10 is held out there) contains: the eval's prompts.
HELD_OUT_SOURCES = ("copy.py", "glob.py", "hmac.py", "sched.py", "symtable.py", "modulefinder.py")
EVAL_PROMPTS = 4
EVAL_NEW_TOKENS = 32
EVAL_DEPTH = 7
# A short training that still learns something on the demo's few hundred rows: a higher learning
# rate and a smaller draft vocabulary than the defaults (see docs/train.md, "Measured").
TRAIN_FIELDS = {
    "epochs": "4",  # about 50 s on 2 cores; the time limit caps it on a slower machine
    "lr": "2e-3",
    "batch_tokens": "2048",
    "draft_vocab_size": "1024",
    "threads": "1",
}


def prepare(base: Path) -> dict[str, Any]:
    """(In the child) the target model, the sample dataset and the held-out eval prompts."""
    from extractor.demo import docstrings, target_model, write_dataset

    base.mkdir(parents=True, exist_ok=True)
    model = target_model()
    data = base / "sample.jsonl"
    rows = write_dataset(data)
    prompts = base / "heldout-prompts.jsonl"
    held = docstrings(EVAL_PROMPTS * 4, HELD_OUT_SOURCES)[::4][:EVAL_PROMPTS]
    with open(prompts, "w", encoding="utf-8") as fh:
        for _, doc in held:
            fh.write(json.dumps({"text": doc[:300]}) + "\n")
    return {
        "model": str(model),
        "data": str(data),
        "rows": rows,
        "prompts": str(prompts),
        "eval_prompts": len(held),
    }

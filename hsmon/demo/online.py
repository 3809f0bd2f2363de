"""`make demo DEMO_ARGS=--online`: the online recipe end to end on the demo's target and sample.

`hsmon online` (a real `hsmon extract` into a spool, a real `hsmon train --follow --passes E
--consume` on it, a real `hsmon daemon` watching both), then `hsmon eval-drafter` on the held-out
prompts; its lines are printed as they come, then the ledger's figures and the verdict.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hsmon.contracts import spool
from hsmon.demo.prepare import EVAL_DEPTH, PROFILES

CHUNK_ROWS = 25  # the unit the trainer reads and frees: 12 chunks for the embedded sample
PASSES = "2"  # each row in 2 batches: the run ends by itself, every chunk consumed


def online_command(base: Path, setup: dict[str, Any], train_seconds: float) -> list[str]:
    fields = dict(PROFILES[setup.get("preset", "embedded")].train_fields)
    fields.pop("epochs", None)
    fields.pop("threads", None)
    train_args = [f"--train-arg=--{k.replace('_', '-')}={v}" for k, v in fields.items()]
    return [sys.executable, "-m", "hsmon", "online", setup["data"], "--out", str(base / "online"),
            "--model", setup["model"], "--passes", PASSES, "--chunk-size", str(CHUNK_ROWS), "--threads", "2",
            "--daemon", f"--train-arg=--time-limit={3 * train_seconds:g}", *train_args]


def run_online(base: Path, setup: dict[str, Any], train_seconds: float, eval_prompts: int) -> int:
    shutil.rmtree(base / "online", ignore_errors=True)
    started = time.monotonic()
    argv = online_command(base, setup, train_seconds)
    print("demo: " + " ".join(a if " " not in a else repr(a) for a in argv[2:]), flush=True)
    proc = subprocess.run(argv)
    if proc.returncode != 0:
        print(f"demo: hsmon online exited {proc.returncode}; logs in {base / 'online'}", file=sys.stderr)
        return 1
    ledger = spool.read_ledger(base / "online" / "spool")
    counts = sorted(set(ledger.passes.values()))
    print(f"demo: ledger: {len(ledger.passes)} rows trained, passes per row {counts}, "
          f"{ledger.consumed_rows} rows consumed ({ledger.consumed_bytes / 1e6:.1f} MB freed), "
          f"ended {ledger.ended}", flush=True)
    profile = PROFILES[setup.get("preset", "embedded")]
    evaluated = subprocess.run(
        [sys.executable, "-m", "hsmon", "eval-drafter", "--drafter", str(base / "online" / "drafter"),
         "--target-model", setup["model"], "--prompts", setup["prompts"], "--depth", str(EVAL_DEPTH),
         "--max-new-tokens", str(profile.eval_new_tokens), "--max-prompts", str(eval_prompts),
         "--threads", "1", "--json"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    if evaluated.returncode != 0:
        print(f"demo: eval-drafter exited {evaluated.returncode}", file=sys.stderr)
        return 1
    result = json.loads(evaluated.stdout.strip().splitlines()[-1])
    (base / "online" / "acceptance.json").write_text(json.dumps(result, indent=1) + "\n")
    lengths = result["acceptance_length"]
    print(f"demo: acceptance at depth {EVAL_DEPTH}: online EAGLE-3 drafter "
          f"{lengths['eagle3'][str(EVAL_DEPTH)]:.3f}, n-gram {lengths['ngram'][str(EVAL_DEPTH)]:.3f} "
          "tokens per target forward", flush=True)
    ok = ledger.ended in ("done", "stopped") and result["outputs_match_greedy"] and bool(ledger.passes)
    if ledger.ended_reason == "out_of_time":
        print(f"demo: the training reached its time limit ({3 * train_seconds:g} s of steps) before every "
              "row had its passes (a slow or busy machine)", flush=True)
    print(f"demo: online {'OK' if ok else 'FAILED'} in {time.monotonic() - started:.0f} s", flush=True)
    return 0 if ok else 1

"""`make demo DEMO_ARGS=--regenerate`: the target's own answers first.

A real `hsmon regenerate` of the demo's sample (greedy, the embedded target in-process) into
base/regen, watched by the demo's daemon as a job of its own (kind regenerate) and shown by the TUI;
once it is done, the extraction reads base/regen (the target's answers in place of the functions'
sources), then the training and the evaluation go on as in the plain demo.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hsmon.contracts import events as ev
from hsmon.contracts import regen_layout

# the longest answer: the eval decodes 32 (embedded) or 24 (smollm2) new tokens a prompt
NEW_TOKENS = {"embedded": 64, "smollm2": 48}
EVENTS = "regen-events.jsonl"


def start_regeneration(base: Path, setup: dict[str, Any]) -> subprocess.Popen[bytes]:
    """A real `hsmon regenerate` of the sample into base/regen, logging to base/regenerate.log."""
    new_tokens = NEW_TOKENS.get(setup.get("preset", "embedded"), 64)
    with open(base / "regenerate.log", "ab") as log:
        return subprocess.Popen(
            [
                sys.executable, "-m", "hsmon", "regenerate", setup["data"],
                "--out", str(base / "regen"),
                "--model", setup["model"],
                "--events", str(base / EVENTS),
                "--job", "regenerate",
                "--max-new-tokens", str(new_tokens),
                "--threads", "1",
                "--min-free", "100M",
                "--heartbeat", "1",
            ],
            stdout=log,
            stderr=log,
            start_new_session=True,  # stopped by the demo, in order (hsmon/demo/stopping.py)
        )  # fmt: skip


def daemon_config(base: Path) -> Path:
    """base/regen.toml: the regeneration as a job of the demo's daemon (the extraction's job is given
    by flags; it starts after the regeneration, its PID read from its start event)."""
    path = base / "regen.toml"
    out, events = json.dumps(str(base / "regen")), json.dumps(str(base / EVENTS))
    path.write_text(f'[[job]]\nname = "regenerate"\nkind = "regenerate"\nout_dir = {out}\n'
                    f"events = {events}\n")
    return path


def finish_regeneration(pipeline: Any) -> bool:
    """Wait for the regeneration (the pipeline's first phase) and say how it went; True when its
    dataset is ready for the extraction (every row regenerated, the daemon says done)."""
    proc = pipeline.regeneration
    started = time.monotonic()
    while proc.poll() is None:
        if pipeline.cancel.wait(0.5):
            return False
    state = pipeline._wait_state("regenerate")
    seen = list(ev.iter_events(pipeline.base / EVENTS)) if (pipeline.base / EVENTS).is_file() else []
    done = next((e for e in reversed(seen) if e["kind"] == "done"), None)
    totals = regen_layout.read_totals(pipeline.base / "regen")
    ok = proc.returncode == 0 and state == "done" and done is not None
    if ok:
        pipeline.results["regeneration"] = {
            "rows": totals.rows, "rejects": totals.rejects, "tokens": totals.answer_tokens,
            "cut": totals.truncated_rows, "mean": totals.mean_answer_tokens(),
            "source_mean": totals.mean_source_tokens(), "seconds": done["seconds"],
            "wall_seconds": time.monotonic() - started, "output": str(pipeline.base / "regen"),
        }
    if ok and totals.rows != pipeline.setup["rows"]:
        pipeline.say(f"demo: the regeneration wrote {totals.rows} of {pipeline.setup['rows']} rows; every "
                     "row of the sample should pass")
        ok = False
    pipeline.say(f"regeneration exited {proc.returncode}; the daemon says {state or 'nothing'}: "
                 f"{'OK' if ok else 'FAILED'}")
    return ok


def summary_line(result: dict[str, Any]) -> str:
    """'  regeneration 300 rows, 17,950 tokens (mean answer 59.8, the source's 121.5; 210 cut at
    --max-new-tokens), 61.0 s -> base/regen'."""
    means = ""
    if result["mean"] is not None and result["source_mean"] is not None:
        means = f"mean answer {result['mean']:.1f}, the source's {result['source_mean']:.1f}; "
    return (f"  regeneration {result['rows']} rows ({result['rejects']} rejected), {result['tokens']:,} "
            f"tokens ({means}{result['cut']} cut at --max-new-tokens), {result['seconds']:.1f} s -> "
            f"{result['output']}")

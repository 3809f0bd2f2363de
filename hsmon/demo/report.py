"""What the demo prints: status lines while it runs headless, and the closing summary."""

from __future__ import annotations

import time

from hsmon.demo.pipeline import Pipeline, daemon_status, eval_progress
from hsmon.demo.prepare import EVAL_DEPTH
from hsmon.status_doc import ENDED_STATES

MEANING = (
    "  meaning: tokens each verifying target forward yields (its own token plus the accepted drafts; "
    f"1.0 = no speed-up, at most {EVAL_DEPTH + 1:.1f} at depth {EVAL_DEPTH}). A one-minute drafter shows "
    "the pipeline works; the reference shows what the same training does in the bench's 10 minutes; "
    "n-gram copies text the prompt or output already holds."
)


def summary(pipeline: Pipeline) -> list[str]:
    """The closing lines: what each step produced, and how long it took."""
    from hsmon.contracts.units import format_bytes

    lines = ["summary"]
    setup = pipeline.setup
    if "prepare_seconds" in setup:
        lines.append(
            f"  target      {setup.get('preset', 'embedded')}: {setup['model']} "
            f"(prepared with {setup['rows']} rows in {setup['prepare_seconds']:.1f} s)"
        )
    r = pipeline.results.get("regeneration")
    if r:
        from hsmon.demo.regenerate import summary_line

        lines.append(summary_line(r))
    x = pipeline.results.get("extraction")
    if x:
        lines.append(
            f"  extraction  {x['rows']} rows ({x['rejects']} rejected), {x['tokens']:,} tokens, "
            f"{format_bytes(x['bytes'])}, {x['seconds']:.1f} s extracting -> {x['output']}"
        )
    t = pipeline.results.get("training")
    if t:
        seconds = f"{t['seconds']:.1f} s" if t["seconds"] is not None else "? s"
        accs = " ".join(f"{a:.2f}" for a in t["accs"]) or "none"
        lines.append(
            f"  training    {t['steps']} steps, {seconds}, {t['tokens']:,} tokens"
            f"{' (time limit reached)' if t['time_limit_reached'] else ''}, "
            f"{t['wall_seconds']:.0f} s from launch to done -> {t['output']}"
        )
        held, trained = t.get("held_out_rows"), t.get("rows")
        if held is not None and trained is not None:
            prompts = setup.get("eval_prompts")
            also = f"; {prompts} held-out prompts for the acceptance" if prompts else ""
            rows = f"{held} of {held + trained} extracted rows"
            lines.append(f"  held out    {rows}, not trained on (the accuracy below){also}")
        lines.append(f"  held-out accuracy per draft position  {accs}")
    a = pipeline.results.get("acceptance")
    if a:
        ref = pipeline.results.get("reference")
        took = f"{a['seconds']:.0f} s" + (f" + {ref['seconds']:.0f} s for the reference" if ref else "")
        lines.append(
            f"  acceptance  tokens per target forward, {a['prompts']} held-out prompts x "
            f"{a['max_new_tokens']} new tokens, outputs equal greedy: "
            f"{'yes' if a['outputs_match_greedy'] else 'NO'} ({took})"
        )
        mine = f"this demo's, {t['seconds']:.0f} s of training" if t and t["seconds"] else "this demo's"
        rows = [("EAGLE-3 drafter", a, mine)]
        if ref:
            rows.append(("EAGLE-3 drafter", ref, pipeline.results.get("reference_note", "reference")))
        rows.append(("n-gram drafter ", a, "prompt lookup, no training"))
        for label, result, note in rows:
            name = "ngram" if label.startswith("n-gram") else "eagle3"
            lengths = result["acceptance_length"][name]
            lines.append(
                f"    {label}  depth 1 {lengths['1']:.3f}  depth {EVAL_DEPTH} {lengths[str(EVAL_DEPTH)]:.3f}"
                f"   {note}"
            )
        if not ref and pipeline.results.get("reference_note"):
            lines.append(f"    ({pipeline.results['reference_note']})")
        lines.append(MEANING)
    return lines


def headless(url: str, pipeline: Pipeline, interval: float, started: float) -> None:
    """Status lines (each job's, and the eval's) until the pipeline ends; stamps count from ``started``."""
    from hsmon.tui.view import status_line

    printed_done: set[str] = set()
    while True:
        finished = not pipeline.thread.is_alive()
        document = daemon_status(url)
        stamp = f"[{time.monotonic() - started:6.1f}s]"
        if document is None:
            print(f"{stamp} daemon at {url}: disconnected, retrying", flush=True)
        else:
            for job in document.jobs:
                if job.job in printed_done and not finished:
                    continue  # a finished job's line once is enough while the next step runs
                if job.state in ENDED_STATES:
                    printed_done.add(job.job)
                print(f"{stamp} {status_line(job)}", flush=True)
        if pipeline.phase == "evaluating":
            print(f"{stamp} {eval_line(pipeline)}", flush=True)
        if finished:
            return
        pipeline.thread.join(interval)


def eval_line(pipeline: Pipeline) -> str:
    """'eval-drafter: RUNNING  decodes 24 / 60 (40.0%)  elapsed 10s', from the eval's own events."""
    from hsmon.tui.view import progress_label

    done, total = eval_progress(pipeline.eval_events)
    elapsed = time.monotonic() - pipeline.phase_started
    return f"eval-drafter: RUNNING  decodes {progress_label(done, total)}  elapsed {elapsed:.0f}s"


def finish_eval_in_terminal(pipeline: Pipeline) -> None:
    """The dashboard was closed while `hsmon eval-drafter` runs: let it finish (it is the demo's last
    step) with its progress on one terminal line; Ctrl-C stops it."""
    print("demo: the dashboard is closed; eval-drafter goes on (Ctrl-C stops it)", flush=True)
    while pipeline.thread.is_alive() and pipeline.phase == "evaluating":
        print(f"\r{eval_line(pipeline)}   ", end="", flush=True)
        pipeline.thread.join(0.5)
    print(flush=True)

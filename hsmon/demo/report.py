"""What the demo prints: status lines while it runs headless, and the closing summary."""

from __future__ import annotations

import time

from hsmon.demo.pipeline import Pipeline, daemon_status, eval_progress
from hsmon.demo.prepare import EVAL_DEPTH


def summary(pipeline: Pipeline) -> list[str]:
    """The closing lines: what each step produced."""
    from hsmon.units import format_bytes

    lines = ["summary"]
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
            f"{' (time limit reached)' if t['time_limit_reached'] else ''} -> {t['output']}"
        )
        lines.append(f"  held-out accuracy per unroll step  {accs}")
    a = pipeline.results.get("acceptance")
    if a:
        lengths = a["acceptance_length"]
        lines.append(
            f"  acceptance  tokens per target forward, {a['prompts']} held-out prompts x "
            f"{a['max_new_tokens']} new tokens, outputs equal greedy: "
            f"{'yes' if a['outputs_match_greedy'] else 'NO'} ({a['seconds']:.0f} s)"
        )
        for name, label in (("eagle3", "EAGLE-3 drafter"), ("ngram", "n-gram drafter ")):
            lines.append(
                f"    {label}  depth 1 {lengths[name]['1']:.3f}  "
                f"depth {EVAL_DEPTH} {lengths[name][str(EVAL_DEPTH)]:.3f}"
            )
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
            for job in document.get("jobs") or []:
                name = str(job.get("job"))
                if name in printed_done and not finished:
                    continue  # a finished job's line once is enough while the next step runs
                if job.get("state") == "done":
                    printed_done.add(name)
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

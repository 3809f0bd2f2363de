"""Benchmark: bench/online.py run several times, and the spread over the runs of the figures
that differ from run to run (the online drafter's acceptance against the offline one's, the
overlap, the tokens trained).

Each run prints its own RESULT line (its `accept_ratio` with `accept_ratio_p5`/`_p95`, the
spread over prompts of that run); this one adds the spread over runs: the lowest, the median and
the highest of each figure.

    python bench/online_runs.py [--runs 3] [bench/online.py's arguments, e.g. --quick]
Ends with: RESULT runs=N accept_ratio_min=... accept_ratio_median=... accept_ratio_max=...
           accept_ratio_p5_min=... accept_ratio_p95_max=... overlap_min=... overlap_median=...
           overlap_max=... tokens_ratio_min=... tokens_ratio_max=... goals_met=a/b,...
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ("accept_ratio", "overlap", "tokens_ratio", "offline_ratio")


def result_of(output: str) -> dict[str, str]:
    line = next(x for x in reversed(output.splitlines()) if x.startswith("RESULT "))
    return dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    args, rest = parser.parse_known_args()
    results = []
    for run in range(1, args.runs + 1):
        proc = subprocess.run([sys.executable, str(ROOT / "bench" / "online.py"), *rest],
                              capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n", file=sys.stderr)
            raise SystemExit(f"bench/online_runs.py: run {run} failed ({proc.returncode})")
        result = result_of(proc.stdout)
        results.append(result)
        print(f"run {run}: accept_ratio={result['accept_ratio']} ({result['accept_ratio_p5']}-"
              f"{result['accept_ratio_p95']} over prompts) overlap={result['overlap']} "
              f"tokens_ratio={result['tokens_ratio']} goals_met={result['goals_met']}", flush=True)
    fields = [f"runs={len(results)}"]
    for name in FIGURES:
        values = [float(r[name]) for r in results]
        fields += [f"{name}_min={min(values):.3f}", f"{name}_median={statistics.median(values):.3f}",
                   f"{name}_max={max(values):.3f}"]
    fields += [f"accept_ratio_p5_min={min(float(r['accept_ratio_p5']) for r in results):.3f}",
               f"accept_ratio_p95_max={max(float(r['accept_ratio_p95']) for r in results):.3f}",
               "goals_met=" + ",".join(r["goals_met"] for r in results)]
    print("RESULT " + " ".join(fields), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

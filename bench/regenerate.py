"""What the target's own answers are worth to the drafter, and what `hsmon regenerate` costs against a
bare loop of /generate calls. On the embedded target and on SmolLM2-135M-Instruct (CPU, fp32):

1. The dataset: "Write a Python function `name`: <docstring>" requests answered by the function's own
   source (functions of the standard library files the embedded target was trained on), and held-out
   prompts of the same kind for functions of the held-out files (CRC-32 of the path = 0 mod 10), which
   neither training below sees.
2. One `hsmon sglang-serve` of the target. Throughput: `hsmon regenerate --backend sglang` (greedy,
   --max-new-tokens N, --concurrency C) against a bare loop of C threads posting the same /generate
   requests (the same prompt ids, sampling and end-of-turn ids) to the same server, on the dataset's
   first rows, alternated three times (each one's best round reported, and the ratio over all);
   the answers' tokens (end-of-turn not counted) per second of each, from the first answer's request
   to the last answer (hsmon: its start event to its done event). Goal: ratio >= 0.95.
3. The same server extracts the dataset's answers and the target's own (one engine for everything the
   drafter learns from); two drafters are trained with the same settings and steps (no time limit),
   one on each, and exported.
4. Their acceptance on the held-out prompts: hsmon's evaluator (depths 1..7, n-gram beside) and
   SGLang's own speculative decoding (`hsmon eval-drafter --engine sglang`, 4 draft tokens).

Not part of make test (many minutes on 2 cores); run it on a quiet machine (it prints the load).
usage: python bench/regenerate.py [--targets embedded,smollm2] [--quick] [--work DIR]
Last line: RESULT, per target ({target}: embedded, smollm2), {target}_{source|own}_evaluator_d{1,7}
           and _engine_d3, _evaluator_d3 (each drafter: hsmon's evaluator at depths 1 and 7, SGLang's
           spec_accept_length and the evaluator at its depth 3), {target}_ngram_d{1,7},
           {target}_gain_d7 (own / source, the evaluator at depth 7), {target}_engine_gain (own /
           source, SGLang), {target}_regen_tok_s, {target}_bare_tok_s, {target}_throughput_ratio
           (best rounds; goal >= 0.95) and _ratio_mean (every round), {target}_mean_answer and
           _mean_source (tokens); e.g. RESULT embedded_gain_d7=... embedded_engine_gain=...
           embedded_throughput_ratio=... smollm2_gain_d7=... smollm2_engine_gain=...
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._acceptance_data import chat_requests, stdlib_files  # noqa: E402
from bench.sglang_transport import start_sglang_serve, stop_sglang_serve  # noqa: E402

PROFILES = {
    # SGLang's CPU engine decodes the embedded target at ~100-200 tokens/s on 2 shared cores
    "embedded": {"rows": 384, "new_tokens": 96, "max_steps": 400, "eval_prompts": 12, "eval_new_tokens": 64,
                 "concurrency": 16, "throughput_rows": 64},
    # a real 135 M model: SGLang's CPU engine decodes it at 3-20 tokens/s here (its 49k-token head),
    # so fewer rows and shorter answers
    "smollm2": {"rows": 96, "new_tokens": 48, "max_steps": 300, "eval_prompts": 4, "eval_new_tokens": 32,
                "concurrency": 8, "throughput_rows": 8},
}
QUICK = {"rows": 32, "new_tokens": 24, "max_steps": 20, "eval_prompts": 2, "eval_new_tokens": 16,
         "concurrency": 4, "throughput_rows": 16}
ENGINE_DEPTH = 3
ROUNDS = 3  # throughput rounds of each; the least disturbed of each (its best) and their means reported


def hsmon(*args: str, threads: int = 1, capture: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads)}
    return subprocess.run([sys.executable, "-m", "hsmon", *args], check=True, cwd=ROOT, env=env,
                          stdout=subprocess.PIPE if capture else None, text=True)


def events_of(path: Path) -> list[dict]:
    from hsmon.contracts.events import iter_events

    return list(iter_events(path))


def datasets(args: argparse.Namespace, work: Path) -> tuple[Path, Path]:
    """source.jsonl (requests answered by the functions' sources) and held-out.jsonl (prompts only)."""
    from extractor.target_text import function_requests

    train_files, held_files = stdlib_files()
    pairs = [(request, code) for _, request, code in function_requests(train_files, 1500)]
    import random

    random.Random(1).shuffle(pairs)
    source, held = work / "source.jsonl", work / "held-out.jsonl"
    source.write_text("".join(json.dumps({"id": f"f{i}", "conversations": [
        {"role": "user", "content": r}, {"role": "assistant", "content": c}]}) + "\n"
        for i, (r, c) in enumerate(pairs[: args.rows])))
    held.write_text("".join(json.dumps({"messages": [{"role": "user", "content": r}]}) + "\n"
                            for r in chat_requests(held_files, args.eval_prompts, seed=7)))
    return source, held


def bare_loop(url: str, target: Path, data: Path, args: argparse.Namespace) -> tuple[int, float]:
    """The baseline: the same /generate requests as hsmon regenerate's, C threads, nothing else; (the
    answers' tokens without their end-of-turn id, seconds)."""
    import requests
    from transformers import AutoTokenizer, GenerationConfig

    from extractor.regenerate.turns import end_of_turn_ids

    tok = AutoTokenizer.from_pretrained(target)
    stop = end_of_turn_ids(tok, GenerationConfig.from_pretrained(target).eos_token_id)
    prompts = []
    for line in data.read_text().splitlines():
        user = json.loads(line)["conversations"][:1]
        text = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
        prompts.append(list(tok(text, add_special_tokens=False)["input_ids"]))
    params = {"max_new_tokens": args.new_tokens, "temperature": 0.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
              "repetition_penalty": 1.0, "stop_token_ids": stop}
    session = requests.Session()

    def one(ids: list[int]) -> int:
        out = session.post(url + "/generate", json={"input_ids": ids, "sampling_params": params},
                           timeout=600).json()
        got = out["output_ids"]
        return len(got) - (1 if got and got[-1] in stop else 0)

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        tokens = sum(pool.map(one, prompts))
    return tokens, time.perf_counter() - started


def regenerate(url: str, target: Path, data: Path, out: Path, args: argparse.Namespace) -> tuple[int, float]:
    """hsmon regenerate --backend sglang; (its answers' tokens, seconds from its start to its done)."""
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    events = out.with_suffix(".events.jsonl")
    events.unlink(missing_ok=True)
    hsmon("regenerate", str(data), "--out", str(out), "--model", str(target), "--backend", "sglang",
          "--url", url, "--concurrency", str(args.concurrency), "--max-new-tokens", str(args.new_tokens),
          "--events", str(events))
    seen = events_of(events)
    start = next(e for e in seen if e["kind"] == "start")
    done = next(e for e in seen if e["kind"] == "done")
    return done["tokens_done"], done["ts"] - start["ts"]


def train(data_dir: Path, target: Path, run: Path, args: argparse.Namespace) -> dict:
    """The same training for both datasets: steps, seed, batch, learning rate, draft vocabulary."""
    events = run.with_suffix(".events.jsonl")
    started = time.perf_counter()
    hsmon("train", str(data_dir), "--target-model", str(target), "--out", str(run), "--max-steps",
          str(args.max_steps), "--batch-tokens", "2048", "--lr", "2e-3", "--seed", "0", "--draft-vocab-size",
          "1024", "--events", str(events), "--threads", str(args.threads), "--checkpoint-every", "100000",
          threads=args.threads)
    hsmon("export-drafter", str(run), "--out", str(run) + "-export", threads=args.threads)
    done = [e for e in events_of(events) if e["kind"] == "done"][-1]
    return {"steps": done["step"], "seconds": time.perf_counter() - started}


def evaluate(drafter: Path, target: Path, held: Path, args: argparse.Namespace) -> dict:
    """hsmon's evaluator (depths 1..7, n-gram beside) and SGLang serving the drafter (depth 3)."""
    mine = json.loads(hsmon("eval-drafter", "--drafter", str(drafter), "--target-model", str(target),
                            "--prompts", str(held), "--depth", "7", "--max-new-tokens",
                            str(args.eval_new_tokens), "--json", "--threads", "1",
                            capture=True).stdout.strip().splitlines()[-1])
    figures = mine["sets"]["held-out"]
    engine = None
    if (ROOT / ".sglang-venv" / "bin" / "python").exists():
        served = hsmon("eval-drafter", "--engine", "sglang", "--drafter", str(drafter), "--target-model",
                       str(target), "--prompts", str(held), "--depth", str(ENGINE_DEPTH), "--max-new-tokens",
                       str(args.eval_new_tokens), "--json", "--threads", "1", capture=True)
        engine = json.loads(served.stdout.strip().splitlines()[-1])["sets"]["held-out"]
    lengths = figures["acceptance_length"]
    return {"evaluator": lengths["eagle3"], "ngram": lengths["ngram"],
            "greedy": figures["outputs_match_greedy"], "engine": engine}


def bench_target(name: str, args: argparse.Namespace, work: Path) -> dict[str, float]:
    from extractor.targets import resolve_model
    from hsmon.contracts.capture_points import default_capture_points

    target = resolve_model(name)
    work.mkdir(parents=True, exist_ok=True)
    source, held = datasets(args, work)
    layers = default_capture_points(json.loads((target / "config.json").read_text())["num_hidden_layers"])
    server, url = start_sglang_serve(target, work / "dump", work / "sglang.log", layers, ["--sleep-on-idle"])
    rates: dict[str, list[tuple[int, float]]] = {"bare": [], "regen": []}
    timed = work / "throughput.jsonl"  # the first rows: the rounds' requests (the whole set takes long)
    timed.write_text("".join(source.read_text().splitlines(keepends=True)[: args.throughput_rows]))
    try:
        for round_ in range(ROUNDS):  # alternated: a change of the machine's load hits both
            rates["bare"].append(bare_loop(url, target, timed, args))
            rates["regen"].append(regenerate(url, target, timed, work / f"timed-{round_}", args))
        regenerate(url, target, source, work / "regen", args)  # every row: the own answers' dataset
        for label, data in (("source", source), ("own", work / "regen")):
            hsmon("extract", str(data), "--out", str(work / f"hs-{label}"), "--model", str(target),
                  "--backend", "sglang", "--url", url, "--dump-dir", str(work / "dump" / label), "--events",
                  str(work / f"hs-{label}.events.jsonl"))
    finally:
        stop_sglang_serve(server)
    figures: dict[str, float] = {}
    results = {}
    for label in ("source", "own"):
        run = train(work / f"hs-{label}", target, work / f"train-{label}", args)
        drafter = Path(str(work / f"train-{label}") + "-export")
        results[label] = {**run, **evaluate(drafter, target, held, args)}
    return report(name, rates, results, figures, work)


def report(name: str, rates: dict, results: dict, figures: dict[str, float], work: Path) -> dict[str, float]:
    tok = {k: max(t / s for t, s in v) for k, v in rates.items()}  # each one's least disturbed round
    mean = {k: sum(t for t, _ in v) / sum(s for _, s in v) for k, v in rates.items()}
    print(f"{name}: throughput at the same concurrency on the same server, the best of {ROUNDS} alternated "
          f"rounds: hsmon regenerate {tok['regen']:.1f} tok/s, bare /generate loop {tok['bare']:.1f} tok/s "
          f"(ratio {tok['regen'] / tok['bare']:.3f}; over all rounds {mean['regen'] / mean['bare']:.3f}; "
          "rounds, tokens/seconds: "
          + ", ".join(f"{key} {t}/{s:.1f}" for key in ("bare", "regen") for t, s in rates[key]) + ")",
          flush=True)
    from hsmon.contracts.regen_layout import read_totals

    totals = read_totals(work / "regen")
    print(f"{name}: the target's answers: mean {totals.mean_answer_tokens():.1f} tokens against the "
          f"source's {totals.mean_source_tokens():.1f}; {totals.truncated_rows} of {totals.rows} cut at "
          "--max-new-tokens")
    print(f"{name}: acceptance on held-out prompts (tokens per target forward)")
    print("  depth      source     own    n-gram")
    for d in range(1, 8):
        s, o = results["source"]["evaluator"][str(d)], results["own"]["evaluator"][str(d)]
        print(f"  {d:>5}  {s:8.3f}  {o:8.3f}  {results['source']['ngram'][str(d)]:8.3f}")
    for label in ("source", "own"):
        r = results[label]
        engine = r["engine"]
        served = "" if not engine else (
            f"; SGLang spec_accept_length {engine['spec_accept_length']:.3f} at depth {ENGINE_DEPTH} "
            f"(hsmon's evaluator {engine['evaluator']:.3f}, n-gram {engine['ngram']:.3f})")
        print(f"  {label}: {r['steps']} steps in {r['seconds']:.0f} s; greedy reproduced {r['greedy']}"
              f"{served}")
        figures[f"{name}_{label}_evaluator_d1"] = r["evaluator"]["1"]
        figures[f"{name}_{label}_evaluator_d7"] = r["evaluator"]["7"]
        if engine:
            figures[f"{name}_{label}_engine_d{ENGINE_DEPTH}"] = engine["spec_accept_length"]
            figures[f"{name}_{label}_evaluator_d{ENGINE_DEPTH}"] = engine["evaluator"]
    figures[f"{name}_ngram_d1"] = results["source"]["ngram"]["1"]
    figures[f"{name}_ngram_d7"] = results["source"]["ngram"]["7"]
    figures[f"{name}_gain_d7"] = results["own"]["evaluator"]["7"] / results["source"]["evaluator"]["7"]
    if results["own"]["engine"] and results["source"]["engine"]:
        figures[f"{name}_engine_gain"] = (results["own"]["engine"]["spec_accept_length"]
                                          / results["source"]["engine"]["spec_accept_length"])
    figures.update({f"{name}_regen_tok_s": tok["regen"], f"{name}_bare_tok_s": tok["bare"],
                    f"{name}_throughput_ratio": tok["regen"] / tok["bare"],
                    f"{name}_throughput_ratio_mean": mean["regen"] / mean["bare"],
                    f"{name}_mean_answer": totals.mean_answer_tokens() or 0.0,
                    f"{name}_mean_source": totals.mean_source_tokens() or 0.0})
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--targets", default="embedded,smollm2", help="comma-separated presets")
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few minutes: " + ", ".join(
        f"{k}={v}" for k, v in QUICK.items()))
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1), help="training threads")
    parser.add_argument("--work", default=None, help="keep everything here (default: a temporary directory)")
    parser.add_argument("--reuse", action="store_true", help="with --work: a target whose figures an earlier "
                        "run of the same settings saved there (WORK/TARGET/figures.json) is not run again")
    args = parser.parse_args()
    import tempfile

    figures: dict[str, float] = {}
    print(f"load before: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="hsmon-bench-regen-") as tmp:
        for name in [t.strip() for t in args.targets.split(",") if t.strip()]:
            profile = QUICK if args.quick else PROFILES[name]
            for key, value in profile.items():
                setattr(args, key, value)
            work = Path(args.work or tmp) / name
            saved = work / "figures.json"
            if args.reuse and saved.is_file() and json.loads(saved.read_text())["profile"] == profile:
                print(f"{name}: the figures of the earlier run in {work} (--reuse)", flush=True)
                figures.update(json.loads(saved.read_text())["figures"])
                continue
            mine = bench_target(name, args, work)
            saved.write_text(json.dumps({"profile": profile, "figures": mine, "load": os.getloadavg()}))
            figures.update(mine)
    figures["load"] = os.getloadavg()[0]
    print(f"RESULT quick={int(args.quick)} " + " ".join(f"{k}={v:.3f}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The whole drafter pipeline on the embedded target, on CPU: data, extraction, training, acceptance;
EAGLE 3.1 against EAGLE 3 on the same data, steps, seed and threads.

1. Training prompts: snippets of the Python standard library files the embedded target was trained
   on; each row is a snippet's first tokens (loss mask 0) followed by the target's own greedy
   continuation (loss mask 1), as EAGLE-3 trains on the target's responses.
2. `hsmon extract` writes their hidden states; `hsmon train` trains the drafter (time-boxed by
   --max-steps; the wall time is printed); `hsmon export-drafter` exports it.
   Each architecture of --archs (default eagle3 and eagle3.1) is trained and exported in turn.
3. `hsmon eval-drafter` measures the mean acceptance length on two prompt sets from the held-out
   files (CRC-32 of the path = 0 mod 10, never seen by the target or the drafter), beside the
   prompt-lookup n-gram drafter on the same prompts: "held-out" (short prompts) and
   "long-context" (prompts --long-factor times as long as a training row: the length EAGLE 3.1's
   attention-drift claim is about).

--quick: a few minutes on 2 shared cores (fewer, shorter rows, fewer steps and prompts).

With `--target smollm2` (the real SmolLM2-135M-Instruct, `hsmon make-target --preset smollm2`) the
rows are chat requests ("Write a Python function `name`: <docstring>", functions of the training
files) rendered with its ChatML template, followed by its own greedy answer; the held-out prompts are
the same kind of request for functions of the held-out files; fewer rows and shorter answers, the
same training budget.

usage: python bench/drafter_acceptance.py [--target embedded|smollm2] [--target-model DIR] [--rows N] ...
Last line: RESULT target=... {arch}_{set}_d{1,5,7}=... ngram_{set}_d{1,5,7}=... long_d5_ratio=...
           (eagle3.1 / eagle3 on long-context at depth 5; goal >= 1) train_tok_s_ratio=... (goal >= 0.95)
           {arch}_train_tok_s=... gen_tok_s=... extract_tok_s=...
           {arch}_engine_held_out_d3=... (SGLang's own spec_accept_length serving the export at 4 draft
           tokens, `hsmon eval-drafter --engine sglang`; with .sglang-venv) {arch}_engine_evaluator_d3=...
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._acceptance_data import (  # noqa: E402
    chat_requests,
    self_distilled_chat_rows,
    self_distilled_rows,
    snippets,
    stdlib_files,
)
from bench.spread import accept_len, ratio_spread  # noqa: E402

PROFILES = {
    "embedded": {"rows": 768, "new_tokens": 192, "max_steps": 450, "eval_prompts": 16, "eval_new_tokens": 64},
    # a real 135 M model on 2 shared cores: fewer rows and prompts (eval re-runs the whole sequence per
    # verifying forward), the same training budget
    "smollm2": {"rows": 128, "new_tokens": 128, "max_steps": 400, "eval_prompts": 6, "eval_new_tokens": 48},
}
QUICK = {"rows": 96, "prompt_tokens": 32, "new_tokens": 64, "max_steps": 60, "eval_prompts": 4,
         "eval_new_tokens": 24, "long_prompts": 2, "time_limit": 1e9}  # no time limit: the same steps
ARCH_KEYS = {"eagle3": "e3", "eagle3.1": "e31"}


def read_events(path: Path) -> list[dict]:
    from hsmon.contracts.events import iter_events

    return list(iter_events(path))


def hsmon(*args: str, threads: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads)}
    return subprocess.run([sys.executable, "-m", "hsmon", *args], check=True, cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, text=True)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", choices=sorted(PROFILES), default="embedded",
                        help="target preset and its row kind (default embedded)")  # fmt: skip
    parser.add_argument("--target-model", default=None, help="a model directory instead of the preset's")
    parser.add_argument("--quick", action="store_true", help="a few minutes: " + ", ".join(
        f"{k}={v}" for k, v in QUICK.items()))  # fmt: skip
    parser.add_argument("--archs", default="eagle3,eagle3.1", help="architectures compared (comma-separated)")
    parser.add_argument("--rows", type=int, default=None, help="training rows (768; smollm2 128)")
    parser.add_argument("--prompt-tokens", type=int, default=None, help="embedded: snippet tokens a row (64)")
    parser.add_argument("--new-tokens", type=int, default=None, help="target tokens a row (192; smollm2 128)")
    parser.add_argument("--max-steps", type=int, default=None, help="optimizer steps (450; smollm2 400)")
    parser.add_argument("--time-limit", type=float, default=None,
                        help="seconds of training steps at most, per architecture (570; --quick: none, so "
                             "that every architecture gets the same steps)")
    parser.add_argument("--draft-vocab-size", type=int, default=1024)
    parser.add_argument("--batch-tokens", type=int, default=2048)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-prompts", type=int, default=None, help="held-out prompts (16; smollm2 6)")
    parser.add_argument("--eval-new-tokens", type=int, default=None, help="tokens a prompt (64; smollm2 48)")
    parser.add_argument("--long-prompts", type=int, default=None, help="long-context prompts (4)")
    parser.add_argument("--long-factor", type=int, default=4,
                        help="long-context prompt tokens = this x a training row's tokens (default 4)")
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1),
                        help="torch threads for generating, extracting and training")
    parser.add_argument("--eval-threads", type=int, default=1,
                        help="torch threads for eval-drafter (default 1: on a busy machine a small target "
                             "decodes several times faster on one thread than on two)")
    parser.add_argument("--reuse", action="store_true",
                        help="with --work: reuse the rows, extraction and trained drafters a run with the "
                             "same settings left there (e.g. after an interrupted evaluation)")
    parser.add_argument("--engine-depth", type=int, default=3,
                        help="drafted tokens per verify of the SGLang check (default 3: 4 draft tokens); "
                        "0 = no SGLang check")
    parser.add_argument("--work", default=None, help="keep everything here (default: a temporary directory)")
    args = parser.parse_args()
    defaults = {"prompt_tokens": 64, "long_prompts": 4, "time_limit": 570, **PROFILES[args.target]}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, QUICK.get(key, value) if args.quick else value)
    return args


def make_rows(args: argparse.Namespace, target: Path, train_files: list[Path]) -> list[dict]:
    if args.target == "smollm2":
        requests = chat_requests(train_files, args.rows, seed=1)
        return self_distilled_chat_rows(target, requests, args.new_tokens, args.threads)
    texts = snippets(train_files, args.rows, 1200, seed=1)
    return self_distilled_rows(target, texts, args.prompt_tokens, args.new_tokens, args.threads)


def prompt_sets(args: argparse.Namespace, target: Path, held_files: list[Path], row_tokens: int,
                work: Path) -> dict[str, Path]:
    """held-out.jsonl (short prompts, as before) and long-context.jsonl: held-out text cut to
    ``long_factor`` x a training row's tokens (input_ids, so the length is exact)."""
    from transformers import AutoTokenizer

    if args.target == "smollm2":
        held = [{"messages": [{"role": "user", "content": r}]}
                for r in chat_requests(held_files, args.eval_prompts, seed=7)]  # fmt: skip
    else:
        held = [{"text": t} for t in snippets(held_files, args.eval_prompts, 400, seed=7)]
    tok = AutoTokenizer.from_pretrained(target)
    want = args.long_factor * row_tokens
    long = []
    for text in snippets(held_files, 50 * args.long_prompts, want * 8, seed=11):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if len(ids) >= want:
            long.append({"input_ids": ids[:want]})
        if len(long) == args.long_prompts:
            break
    sets = {"held-out": held, "long-context": long}
    paths = {}
    for name, rows in sets.items():
        paths[name] = work / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


def train_export_eval(args: argparse.Namespace, arch: str, target: Path, work: Path,
                      sets: dict[str, Path], max_prompt_tokens: int) -> dict:
    """Train (same data, steps, seed, threads for every arch), export, evaluate on every set."""
    run, events = work / f"run-{arch}", work / f"train-{arch}.events"
    started = time.perf_counter()
    trained = (work / f"drafter-{arch}" / "config.json").is_file() and events.is_file() and any(
        e["kind"] == "done" for e in read_events(events))
    if args.reuse and trained:
        print(f"{arch}: reusing the drafter trained in {run} (--reuse)", flush=True)
        return evaluate_drafter(args, arch, target, work, sets, max_prompt_tokens, events)
    hsmon("train", str(work / "data"), "--target-model", str(target), "--out", str(run), "--arch", arch,
          "--max-steps", str(args.max_steps), "--batch-tokens", str(args.batch_tokens), "--lr", str(args.lr),
          "--seed", str(args.seed), "--events", str(events), "--threads", str(args.threads),
          "--checkpoint-every", "500", "--time-limit", str(args.time_limit),
          "--draft-vocab-size", str(args.draft_vocab_size), threads=args.threads)  # fmt: skip
    (work / f"train-{arch}.seconds").write_text(f"{time.perf_counter() - started}\n")
    hsmon("export-drafter", str(run), "--out", str(work / f"drafter-{arch}"), threads=args.threads)
    return evaluate_drafter(args, arch, target, work, sets, max_prompt_tokens, events)


def evaluate_drafter(args: argparse.Namespace, arch: str, target: Path, work: Path, sets: dict[str, Path],
                     max_prompt_tokens: int, events: Path) -> dict:
    """eval-drafter on every set, and the training's figures from its events."""
    train_s = float((work / f"train-{arch}.seconds").read_text())
    prompts = [x for path in sets.values() for x in ("--prompts", str(path))]
    started = time.perf_counter()
    proc = hsmon("eval-drafter", "--drafter", str(work / f"drafter-{arch}"), "--target-model", str(target),
                 *prompts, "--depth", "7", "--max-new-tokens", str(args.eval_new_tokens), "--json",
                 "--max-prompt-tokens", str(max_prompt_tokens), "--threads", str(args.eval_threads),
                 threads=args.eval_threads)  # fmt: skip
    result = json.loads(proc.stdout)
    evs = read_events(events)
    done = [e for e in evs if e["kind"] == "done"][-1]
    steps = [e for e in evs if e["kind"] == "step"]
    # steady-state rate: tokens over the steps after the first (its start-up is not the model's cost)
    rate = ((steps[-1]["tokens"] - steps[0]["tokens"]) / max(steps[-1]["ts"] - steps[0]["ts"], 1e-9)
            if len(steps) > 1 else 0.0)  # fmt: skip
    assert result["arch"] == arch, result["arch"]
    return {"sets": result["sets"], "train_s": train_s, "steps": done["step"], "tokens": done["tokens"],
            "train_tok_s": rate, "eval_s": time.perf_counter() - started,
            "engine": engine_figures(args, arch, target, work, sets["held-out"])}


def engine_figures(args: argparse.Namespace, arch: str, target: Path, work: Path,
                   prompts: Path) -> dict | None:
    """SGLang's own acceptance serving the export (a CPU server started by `hsmon eval-drafter
    --engine sglang`) on the held-out set, beside the evaluator's at the same depth; None without
    .sglang-venv or with --engine-depth 0."""
    if not args.engine_depth or not (ROOT / ".sglang-venv" / "bin" / "python").exists():
        print(f"{arch}: no SGLang check (--engine-depth 0 or no .sglang-venv: make sglang-env)", flush=True)
        return None
    proc = hsmon("eval-drafter", "--engine", "sglang", "--drafter", str(work / f"drafter-{arch}"),
                 "--target-model", str(target), "--prompts", str(prompts), "--depth", str(args.engine_depth),
                 "--max-new-tokens", str(args.eval_new_tokens), "--threads", str(args.eval_threads), "--json",
                 threads=args.eval_threads)  # fmt: skip
    return json.loads(proc.stdout.strip().splitlines()[-1])["sets"]["held-out"]


def alternating_step_ratio(target: Path, args: argparse.Namespace, rounds: int = 6) -> float:
    """EAGLE 3.1's optimizer-step time over EAGLE 3's, the two alternated step by step on the same
    batch (forward, backward, AdamW) so that a change of the machine's load hits both alike:
    returns eagle3's fastest step / eagle3.1's fastest step (a tokens/s ratio; on a shared machine
    the load only adds time, so the fastest of several is the least disturbed)."""
    import torch

    from trainer.model import DrafterConfig, Eagle3Drafter

    torch.set_num_threads(args.threads)
    config = json.loads((target / "config.json").read_text())
    length = min(args.batch_tokens, 512)  # a step is seconds on CPU: a shorter batch, the same model
    aux = torch.randn(1, length, 3 * int(config["hidden_size"]))
    next_ids = torch.randint(0, int(config["vocab_size"]), (1, length + 6))
    models = {}
    for arch in ("eagle3", "eagle3.1"):
        cfg = DrafterConfig.from_target_config(config, args.draft_vocab_size, 3)
        cfg.set_arch(arch)
        torch.manual_seed(args.seed)
        model = Eagle3Drafter(cfg)
        models[arch] = (model, torch.optim.AdamW([p for p in model.parameters() if p.requires_grad]))
    times: dict[str, list[float]] = {arch: [] for arch in models}
    for _ in range(rounds + 1):  # the first round warms up
        for arch, (model, optimizer) in models.items():
            started = time.perf_counter()
            logits = model.ttt_logits(aux, next_ids, 7)
            sum(x.float().logsumexp(-1).mean() for x in logits).backward()
            optimizer.step()
            optimizer.zero_grad()
            times[arch].append(time.perf_counter() - started)
    fastest = {arch: min(t[1:]) for arch, t in times.items()}
    return fastest["eagle3"] / fastest["eagle3.1"]


def main() -> int:
    args = parse_args()
    from trainer.target import resolve_target

    target = resolve_target(args.target_model or args.target)
    archs = [a.strip() for a in args.archs.split(",") if a.strip()]
    train_files, held_files = stdlib_files()
    with tempfile.TemporaryDirectory(prefix="hsmon-bench-accept-") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        settings = {k: v for k, v in vars(args).items() if k not in ("reuse", "eval_threads", "work")}
        same = (args.reuse and (work / "settings.json").is_file()
                and json.loads((work / "settings.json").read_text()) == settings)  # fmt: skip
        if args.reuse and not same:
            raise SystemExit(f"--reuse: {work}/settings.json is missing or from other settings; "
                             "run without --reuse")
        if same and (work / "made.json").is_file():
            rows = [json.loads(line) for line in (work / "train.jsonl").read_text().splitlines()]
            made = float(json.loads((work / "made.json").read_text())["seconds"])
        else:
            (work / "settings.json").write_text(json.dumps(settings))
            rows = make_rows(args, target, train_files)
            (work / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            made = time.perf_counter() - started
            hsmon("extract", str(work / "train.jsonl"), "--out", str(work / "data"), "--model", str(target),
                  "--events", str(work / "extract.jsonl"), threads=args.threads)  # fmt: skip
            (work / "made.json").write_text(json.dumps({"seconds": made}))
        generated = sum(sum(r["loss_mask"]) for r in rows)
        row_tokens = max(len(r["input_ids"]) for r in rows)
        extract_done = [e for e in read_events(work / "extract.jsonl") if e["kind"] == "done"][-1]
        sets = prompt_sets(args, target, held_files, row_tokens, work)
        runs = {arch: train_export_eval(args, arch, target, work, sets, args.long_factor * row_tokens + 8)
                for arch in archs}  # fmt: skip
        runs["step_ratio"] = alternating_step_ratio(target, args)
    report(args, target, archs, runs, rows, row_tokens, generated / made,
           extract_done["tokens_done"] / max(extract_done["seconds"], 1e-9))
    return 0


def paired_spread(runs: dict, sets: dict) -> dict[str, float]:
    """Per set, eagle3.1 / eagle3 at depths 5 and 7 with its 5-95 % range from a paired bootstrap
    over the set's prompts, and how many prompts eagle3.1 accepted more / fewer tokens on (printed;
    the long-context d5 range also in RESULT)."""
    fields: dict[str, float] = {}
    for name in sets:
        for d in ("5", "7"):
            on = runs["eagle3.1"]["sets"][name]["per_prompt"]["eagle3"][d]
            off = runs["eagle3"]["sets"][name]["per_prompt"]["eagle3"][d]
            lo, hi = ratio_spread(on, off)
            wins = sum(accept_len([a]) > accept_len([b]) for a, b in zip(on, off, strict=True))
            losses = sum(accept_len([a]) < accept_len([b]) for a, b in zip(on, off, strict=True))
            print(f"{name} depth {d}: eagle3.1 / eagle3 = {accept_len(on) / accept_len(off):.3f} "
                  f"(5-95 % over {len(on)} prompts, paired bootstrap: {lo:.3f}-{hi:.3f}); "
                  f"eagle3.1 ahead on {wins} prompts, behind on {losses}")  # fmt: skip
            if name == "long-context" and d == "5":
                fields.update(long_d5_ratio_p5=lo, long_d5_ratio_p95=hi, long_prompts=len(on),
                              long_d5_wins=wins, long_d5_losses=losses)  # fmt: skip
    return fields


def report(args: argparse.Namespace, target: Path, archs: list[str], runs: dict, rows: list,
           row_tokens: int, gen_tok_s: float, extract_tok_s: float) -> None:
    step_ratio = runs.pop("step_ratio")
    first = runs[archs[0]]["sets"]
    print(f"target {args.target} ({target}); {len(rows)} training rows of up to {row_tokens} tokens; "
          f"{args.threads} threads; seed {args.seed}; load {os.getloadavg()[0]:.2f}")  # fmt: skip
    for arch, run in runs.items():
        print(f"{arch}: {run['steps']} of {args.max_steps} steps, {run['tokens']} tokens "
              f"in {run['train_s']:.0f} s "
              f"({run['train_tok_s']:.0f} tok/s steady), eval {run['eval_s']:.0f} s")  # fmt: skip
    fields = {}
    for name in first:
        print(f"{name}: {first[name]['prompts']} prompts, {first[name]['max_new_tokens']} new tokens each; "
              "mean acceptance length (tokens per target forward); outputs equal greedy: "
              + ", ".join(f"{a} {runs[a]['sets'][name]['outputs_match_greedy']}" for a in archs))  # fmt: skip
        print("depth  " + "  ".join(f"{a:>8}" for a in archs) + "     ngram")
        for d in range(1, 8):
            cells = [runs[a]["sets"][name]["acceptance_length"]["eagle3"][str(d)] for a in archs]
            ngram = first[name]["acceptance_length"]["ngram"][str(d)]
            print(f"{d:>5}  " + "  ".join(f"{c:8.3f}" for c in cells) + f"  {ngram:8.3f}")
        for d in (1, 5, 7):
            for a in archs:
                accept = runs[a]["sets"][name]["acceptance_length"]["eagle3"]
                fields[f"{ARCH_KEYS.get(a, a)}_{name}_d{d}"] = accept[str(d)]
            fields[f"ngram_{name}_d{d}"] = first[name]["acceptance_length"]["ngram"][str(d)]
    if "eagle3" in runs and "eagle3.1" in runs:
        fields["long_d5_ratio"] = fields["e31_long-context_d5"] / fields["e3_long-context_d5"]
        fields.update(paired_spread(runs, first))
        e3_rate = max(runs["eagle3"]["train_tok_s"], 1e-9)
        fields["train_tok_s_ratio"] = runs["eagle3.1"]["train_tok_s"] / e3_rate
    fields["alternating_step_ratio"] = step_ratio
    for a in archs:
        engine = runs[a].get("engine")
        if engine:
            key = ARCH_KEYS.get(a, a)
            print(f"{a}: SGLang serving it at depth {engine['depth']}: spec_accept_length "
                  f"{engine['spec_accept_length']:.3f} (hsmon's evaluator {engine['evaluator']:.3f} counted "
                  f"without the prefill's token, the engine so counted {engine['engine_per_verify']:.3f})"
                  + (f"; {engine['finding']}" if engine["finding"] else ""))  # fmt: skip
            fields[f"{key}_engine_held_out_d{engine['depth']}"] = engine["spec_accept_length"]
            fields[f"{key}_engine_evaluator_d{engine['depth']}"] = engine["evaluator"]
    for a in archs:
        fields[f"{ARCH_KEYS.get(a, a)}_train_tok_s"] = runs[a]["train_tok_s"]
        fields[f"{ARCH_KEYS.get(a, a)}_steps"] = runs[a]["steps"]
    fields.update(gen_tok_s=gen_tok_s, extract_tok_s=extract_tok_s, load=os.getloadavg()[0])
    print(f"RESULT target={args.target} quick={int(args.quick)} "
          + " ".join(f"{k.replace('-', '_')}={v:.3f}" for k, v in fields.items()))  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())

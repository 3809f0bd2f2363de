"""`hsmon eval-drafter --engine sglang`: the acceptance SGLang itself reports for a drafter it
serves, beside hsmon's own evaluator on the same prompts and depth and the n-gram baseline.

SGLang reports, per request, ``meta_info.spec_accept_length`` (output tokens per verifying
forward; its first token, which the prefill yields, is counted), ``spec_verify_ct`` and
``spec_num_correct_drafts``. hsmon's evaluator counts tokens per verifying forward without the
prefill's token; the comparison uses the engine's figure on that same footing,
``(correct drafts + verifies) / verifies``, and prints SGLang's own figure as it reports it.
The server is a running one (``--server URL``) or one started here with
``hsmon sglang-serve --draft DIR`` and stopped afterwards.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from extractor.sglang.supervise import stop_session

DEFAULT_TOLERANCE = 0.15  # relative difference between engine and evaluator that is a finding
CHECKS = (
    "the export's eagle_aux_hidden_state_layer_ids against the layers it was trained on, its draft "
    "vocabulary mapping (d2t/t2d), fc_norm/norm_output in its config.json (a norm applied twice or "
    "not at all), and that the server runs the same build of the target"
)


class EngineError(RuntimeError):
    """The server cannot be used: one line naming it and the fix."""


@dataclass
class PromptFigure:
    """One prompt's figures as SGLang reports them."""

    accept_length: float  # SGLang's spec_accept_length (the prefill's token counted)
    verify_ct: int
    correct_drafts: int
    output_ids: list[int]

    @property
    def per_verify(self) -> float:
        """Tokens per verifying forward without the prefill's token (hsmon's definition)."""
        return (self.correct_drafts + self.verify_ct) / max(self.verify_ct, 1)


@dataclass
class SetFigures:
    """A prompt set's engine figures: per prompt, and pooled."""

    prompts: list[PromptFigure] = field(default_factory=list)

    def lengths(self) -> list[float]:
        return [p.accept_length for p in self.prompts]

    def mean(self) -> float:
        return statistics.fmean(self.lengths())

    def spread(self) -> tuple[float, float, float]:
        """(standard deviation, min, max) of the per-prompt spec_accept_length."""
        values = self.lengths()
        return (statistics.pstdev(values), min(values), max(values))

    def pooled_per_verify(self) -> float:
        verifies = sum(p.verify_ct for p in self.prompts)
        return (sum(p.correct_drafts for p in self.prompts) + verifies) / max(verifies, 1)


def _post(url: str, body: dict, timeout: float = 600) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        return json.loads(resp.read())


def server_depth(url: str) -> int:
    """Drafted tokens per verify of a speculative server (its --speculative-num-steps at top-k 1)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/server_info", timeout=30) as resp:
            info = json.loads(resp.read())
    except OSError as exc:
        raise EngineError(
            f"--server {url}: no answer ({exc}); start one with hsmon sglang-serve --draft DIR"
        ) from None
    if not info.get("speculative_draft_model_path"):
        raise EngineError(
            f"--server {url} does not decode speculatively; start it with hsmon sglang-serve --draft DIR"
        )
    if int(info.get("speculative_eagle_topk") or 1) != 1:
        raise EngineError(
            f"--server {url} drafts a tree (top-k {info['speculative_eagle_topk']}); the evaluator "
            "drafts a chain: serve with --speculative-eagle-topk 1 (hsmon sglang-serve --draft does)"
        )
    return int(info["speculative_num_steps"])


def measure(url: str, prompts: list[list[int]], max_new: int) -> SetFigures:
    """Greedy generation of each prompt on the server; SGLang's speculative figures per prompt.
    EngineError (one line) when the server answers with an error or not at all."""
    figures = SetFigures()
    for n, ids in enumerate(prompts, 1):
        body = {"input_ids": ids,
                "sampling_params": {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True}}
        try:
            out = _post(url.rstrip("/") + "/generate", body)
        except urllib.error.HTTPError as exc:
            said = exc.read(300).decode(errors="replace").replace("\n", " ").strip()
            raise EngineError(f"{url}/generate answered HTTP {exc.code} to prompt {n} of {len(prompts)}"
                              f"{': ' + said if said else ''}; see the server's log") from None
        except (OSError, ValueError) as exc:
            raise EngineError(f"{url}/generate failed on prompt {n} of {len(prompts)} ({exc}); is the server "
                              "still up? see its log") from None
        meta = out.get("meta_info", {})
        if "spec_accept_length" not in meta:
            raise EngineError(
                f"{url}: the answer has no meta_info.spec_accept_length; is it a speculative server?"
            )
        figures.prompts.append(
            PromptFigure(
                float(meta["spec_accept_length"]),
                int(meta.get("spec_verify_ct", 0)),
                int(meta.get("spec_num_correct_drafts", 0)),
                list(out.get("output_ids") or []),
            )
        )
    return figures


def finding(name: str, engine: float, evaluator: float, depth: int, tolerance: float) -> str | None:
    """A disagreement beyond ``tolerance`` (relative), in words; None when they agree."""
    if abs(engine - evaluator) <= tolerance * evaluator:
        return None
    return (
        f"finding: {name}: the engine accepts {engine:.2f}, the evaluator predicted {evaluator:.2f} at depth "
        f"{depth} (beyond the {tolerance:.0%} tolerance): check {CHECKS}"
    )


def serve_command(drafter: Path, target: Path, depth: int, port: int, ready_timeout: float) -> list[str]:
    """``hsmon sglang-serve --draft drafter`` on ``port``."""
    return [
        sys.executable,
        "-m",
        "hsmon",
        "sglang-serve",
        "--model-path",
        str(target),
        "--port",
        str(port),
        "--draft",
        str(drafter),
        "--draft-tokens",
        str(depth + 1),
        "--ready-timeout",
        str(ready_timeout),
        "--no-metrics",
    ]


@contextmanager
def started_server(drafter: Path, target: Path, depth: int, ready_timeout: float = 900,
                   command: Callable[[int], list[str]] | None = None) -> Iterator[str]:
    """``hsmon sglang-serve --draft drafter`` (or ``command(port)``) on a free port until the block ends;
    yields its URL. Its output goes to a file, never to a pipe that nobody reads once it is ready
    (its web server writes a line per request: a full pipe would stop it mid-run)."""
    from extractor.sglang.ports import free_stable_port

    port = free_stable_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")]))}
    argv = command(port) if command else serve_command(drafter, target, depth, port, ready_timeout)
    with tempfile.NamedTemporaryFile(prefix=f"hsmon-eval-server-{port}-", suffix=".log", delete=False) as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        _wait_ready(proc, Path(log.name), drafter)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_session(proc, grace=60)


def _wait_ready(proc: subprocess.Popen, log: Path, drafter: Path) -> None:
    """Until the server's log says "ready at" (sglang-serve's line); EngineError when it exits first."""
    while True:
        with log.open("rb") as fh:
            if b"ready at" in fh.read():
                return
        if proc.poll() is not None:
            raise EngineError(f"hsmon sglang-serve --draft {drafter} exited {proc.returncode} before it was "
                              f"ready; its log: {log}")
        time.sleep(0.5)


def report(
    name: str, figures: SetFigures, evaluator: float, ngram: float, depth: int, tolerance: float
) -> dict:
    """The set's comparison as a dict (the JSON output) and printed lines."""
    std, low, high = figures.spread()
    engine = figures.pooled_per_verify()
    found = finding(name, engine, evaluator, depth, tolerance)
    return {
        "prompts": len(figures.prompts),
        "depth": depth,
        "draft_tokens": depth + 1,
        "spec_accept_length": figures.mean(),
        "spec_accept_length_std": std,
        "spec_accept_length_min": low,
        "spec_accept_length_max": high,
        "per_prompt": figures.lengths(),
        "engine_per_verify": engine,
        "evaluator": evaluator,
        "ngram": ngram,
        "tolerance": tolerance,
        "finding": found,
    }


def print_report(results: dict[str, dict]) -> None:
    for name, r in results.items():
        print(f"{name}: {r['prompts']} prompts, depth {r['depth']} ({r['draft_tokens']} tokens per verify)")
        low, high = r["spec_accept_length_min"], r["spec_accept_length_max"]
        label = "vLLM mean accept length     " if r.get("engine") == "vllm" else "SGLang spec_accept_length"
        print(f"  {label}          {r['spec_accept_length']:.3f} (per prompt: std "
              f"{r['spec_accept_length_std']:.3f}, {low:.3f}-{high:.3f})")
        if r.get("accepted_per_position"):
            rates = " ".join(f"{a:.3f}" for a in r["accepted_per_position"])
            print(f"  vLLM accepted per position         {rates}")
        print(f"  engine, prefill token not counted  {r['engine_per_verify']:.3f}")
        print(f"  hsmon evaluator                    {r['evaluator']:.3f}")
        print(f"  n-gram baseline                    {r['ngram']:.3f}")
        if r.get("outputs_match_greedy") is False:
            print("  WARNING: the engine's greedy tokens differ from the evaluator's (another target build, "
                  "or a numerical tie)")
        agree = f"engine and evaluator agree within {r['tolerance']:.0%}"
        print(f"  {r['finding'] or agree}")


def compare(
    url: str,
    sets: dict[str, list[list[int]]],
    max_new: int,
    evaluate_fn,
    drafter: Path,
    target: Path,
    tolerance: float,
    ngram_max: int,
) -> dict[str, dict]:
    """Per prompt set: the engine's figures at the server's depth beside ``evaluate_fn``'s (hsmon's
    evaluator, trainer.evaluate.evaluate) on the same prompts, depth and token count."""
    depth = server_depth(url)
    results = {}
    for name, prompts in sets.items():
        figures = measure(url, prompts, max_new)
        ours = evaluate_fn(drafter, target, prompts, depth, max_new, ngram_max, depths=[depth])
        accept = ours["acceptance_length"]
        results[name] = report(
            name, figures, accept["eagle3"][str(depth)], accept["ngram"][str(depth)], depth, tolerance
        )
        results[name]["outputs_match_greedy"] = all(
            f.output_ids == ref for f, ref in zip(figures.prompts, ours["greedy_outputs"], strict=True)
        )
    return results


def run_engine(args, sets: dict[str, list[list[int]]], drafter: Path, target: Path, evaluate_fn,
               engine: str = "sglang", compare_fn=None, command=None) -> int:
    """``--engine sglang`` (``compare_fn`` and ``command(port)``: another engine's comparison and server,
    trainer/engine_eval_vllm.py): measure on ``--server`` or on a server started for the drafter."""
    try:
        server = nullcontext(args.server) if args.server else started_server(
            drafter, target, args.depth, command=command)
        with server as url:
            results = (compare_fn or compare)(
                url, sets, args.max_new_tokens, evaluate_fn, drafter, target, args.tolerance, args.ngram_max
            )
    except EngineError as exc:
        print(f"hsmon eval-drafter: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"engine": engine, "sets": results}))
    else:
        print_report(results)
    return 0

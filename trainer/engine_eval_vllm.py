"""`hsmon eval-drafter --engine vllm`: the acceptance vLLM itself reports for a drafter it serves
(`hsmon vllm-serve --draft`), beside hsmon's evaluator and the n-gram baseline on the same prompts and
depth, and a lossless check (greedy decoding with the drafter equals the target's greedy decoding
without it, token for token).

vLLM reports speculative decoding on its ``/metrics`` only, as counters over the server's life:
``vllm:spec_decode_num_drafts`` (verifying forwards that had drafts), ``..._num_draft_tokens``,
``..._num_accepted_tokens`` and ``..._num_accepted_tokens_per_pos{position=k}``. The prompts go one
at a time, so each prompt's figures are the counters' differences around its request: mean accept
length ``1 + accepted / drafts`` (tokens per verifying forward, the prefill's token not counted: the
evaluator's own footing) and per position ``accepted_k / drafts``.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

from trainer import engine_eval
from trainer.engine_eval import (
    EngineError,
    PromptFigure,
    SetFigures,
    _post,
    report,
)

SPEC = "vllm:spec_decode_num_"


def spec_counters(url: str) -> dict[str, float]:
    """vLLM's speculative counters now: drafts, draft_tokens, accepted_tokens, pos<k> (summed over labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=30) as resp:
            text = resp.read().decode()
    except OSError as exc:
        raise EngineError(
            f"--server {url}: no /metrics ({exc}); start one with hsmon vllm-serve --draft DIR"
        ) from None
    lines = [line for line in text.splitlines() if line.startswith(SPEC)]
    found: dict[str, float] = {}
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            name = sample.name.removeprefix(SPEC).removesuffix("_total")
            if name == "accepted_tokens_per_pos":
                name = f"pos{sample.labels.get('position')}"
            found[name] = found.get(name, 0.0) + float(sample.value)
    return found


def measure(
    url: str, model: str, prompts: list[list[int]], max_new: int
) -> tuple[SetFigures, list[list[float]]]:
    """Each prompt generated greedily alone; its figures from the counters' differences around it."""
    figures, per_position = SetFigures(), []
    for ids in prompts:
        before = spec_counters(url)
        out = _post(
            url.rstrip("/") + "/v1/completions",
            {
                "model": model,
                "prompt": ids,
                "max_tokens": max_new,
                "temperature": 0,
                "ignore_eos": True,
                "return_token_ids": True,
            },
        )
        after = spec_counters(url)
        delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
        drafts, accepted = int(delta.get("drafts", 0)), int(delta.get("accepted_tokens", 0))
        if "drafts" not in after:
            raise EngineError(
                f"--server {url} reports no {SPEC}drafts: it does not decode speculatively; start "
                "it with hsmon vllm-serve --draft DIR"
            )
        tokens = list((out.get("choices") or [{}])[0].get("token_ids") or [])
        figures.prompts.append(PromptFigure(1 + accepted / max(drafts, 1), drafts, accepted, tokens))
        positions = sorted((int(k[3:]), v) for k, v in delta.items() if k.startswith("pos"))
        per_position.append([v / max(drafts, 1) for _, v in positions])
    return figures, per_position


def served_model(url: str) -> str:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=30) as resp:
            return str(json.loads(resp.read())["data"][0]["id"])
    except (OSError, ValueError, KeyError, IndexError) as exc:
        raise EngineError(f"--server {url}: no model in /v1/models ({exc}); is it a vLLM server?") from None


def serve_command(
    drafter: Path, target: Path, depth: int, port: int, ready_timeout: float = 900
) -> list[str]:
    """``hsmon vllm-serve --draft`` at ``depth`` drafted tokens per verify (engine_eval.started_server)."""
    return [
        sys.executable,
        "-m",
        "hsmon",
        "vllm-serve",
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
    ]


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
    model = served_model(url)
    results = {}
    for name, prompts in sets.items():
        figures, per_position = measure(url, model, prompts, max_new)
        depth = max((len(p) for p in per_position), default=0)
        if depth < 1:
            raise EngineError(f"--server {url}: no drafts were made; is it serving a drafter (--draft)?")
        ours = evaluate_fn(drafter, target, prompts, depth, max_new, ngram_max, depths=[depth])
        accept = ours["acceptance_length"]
        result = report(
            name, figures, accept["eagle3"][str(depth)], accept["ngram"][str(depth)], depth, tolerance
        )
        drafts = sum(p.verify_ct for p in figures.prompts)
        pooled = [
            sum(
                row[k] * p.verify_ct
                for row, p in zip(per_position, figures.prompts, strict=True)
                if k < len(row)
            )
            / max(drafts, 1)
            for k in range(depth)
        ]
        result.update(
            engine="vllm",
            accepted_per_position=pooled,
            outputs_match_greedy=all(
                f.output_ids == ref for f, ref in zip(figures.prompts, ours["greedy_outputs"], strict=True)
            ),
        )
        results[name] = result
    return results


def run_engine(args, sets: dict[str, list[list[int]]], drafter: Path, target: Path, evaluate_fn) -> int:
    """``--engine vllm``: engine_eval.run_engine with vLLM's comparison and server."""
    return engine_eval.run_engine(
        args,
        sets,
        drafter,
        target,
        evaluate_fn,
        engine="vllm",
        compare_fn=compare,
        command=lambda port: serve_command(drafter, target, args.depth, port),
    )

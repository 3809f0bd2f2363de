"""`hsmon eval-drafter`: mean acceptance length of a drafter against its target, in-process.

Greedy speculative decoding with chain drafting: each round the drafter proposes ``depth`` tokens,
one target forward verifies them, and the round yields the accepted drafts plus the target's own
next token. Acceptance length = tokens yielded per verifying target forward (the prefill, which
every decoder pays, is not counted). The same loop runs with a prompt-lookup (n-gram) drafter on
the same prompts as the baseline. Every variant produces exactly the target's greedy output
(checked), so the figures differ only in how many target forwards they need.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hsmon.contracts import stop_signals
from hsmon.contracts.capture_points import capture_points_of, default_capture_points
from trainer.eval_progress import EvalProgress
from trainer.speculative import Target, ngram_draft, speculative_decode


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--drafter",
        required=True,
        metavar="DIR",
        help="a drafter exported by `hsmon export-drafter` (or a training --out directory)",
    )
    parser.add_argument(
        "--target-model",
        metavar="DIR",
        default=None,
        help="the target's Hugging Face directory (default: the one a training --out's checkpoint names, "
        "else the embedded target)",
    )
    parser.add_argument(
        "--prompts",
        required=True,
        action="append",
        metavar="FILE",
        help='JSONL of prompts: {"input_ids": [...]}, {"text": "..."} or {"messages": [...]} '
        "(rendered with the target's chat template) per line; repeat for several prompt sets "
        "(each measured and reported apart, named by its file name without .jsonl)",
    )
    parser.add_argument("--depth", type=int, default=7, help="measure draft depths 1..DEPTH (default 7)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens generated per prompt")
    parser.add_argument("--max-prompts", type=int, default=None, help="use at most N prompts")
    parser.add_argument(
        "--max-prompt-tokens", type=int, default=256, help="truncate prompts to their last N tokens"
    )
    parser.add_argument(
        "--ngram-max", type=int, default=3, help="longest n-gram the prompt-lookup drafter matches"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument(
        "--events",
        metavar="FILE",
        default=None,
        help="append progress events (start, rows per decode, eval, done/error) to FILE, so that "
        "`hsmon daemon --events FILE` and the TUI follow the measurement as a job",
    )
    parser.add_argument("--job", default="eval-drafter", help="job id in the events (default eval-drafter)")
    parser.add_argument("--engine", choices=("hsmon", "sglang", "vllm"), default="hsmon",
                        help="hsmon: this evaluator alone (depths 1..DEPTH); sglang / vllm: the acceptance "
                        "that the engine reports while it serves the drafter (SGLang's spec_accept_length, "
                        "vLLM's accepted tokens per position) beside this evaluator and n-gram at the "
                        "server's depth, and whether its greedy tokens are the target's "
                        "(docs/serve-drafter.md, docs/vllm.md)")
    parser.add_argument("--server", metavar="URL", default=None,
                        help="with --engine sglang/vllm: a running speculative server (hsmon "
                        "sglang-serve --draft, hsmon vllm-serve --draft); default: start one for --drafter "
                        "with --depth drafted tokens per verify, then stop it")
    parser.add_argument("--tolerance", type=float, default=0.15,
                        help="with --engine sglang: the relative engine/evaluator difference reported as a "
                        "finding (default 0.15)")


DECODE_DELAY_ENV = "HSMON_EVAL_DECODE_DELAY_S"  # read by tests only (docs/development.md, "Signals mid-run")


class PromptError(ValueError):
    """Unusable prompts file."""


def read_prompts(
    path: Path,
    tokenize: Callable[[str], list[int]] | None,
    limit: int | None,
    max_tokens: int,
    chat: Callable[[list[dict[str, str]]], list[int]] | None = None,
) -> list[list[int]]:
    """Token-id prompts from a JSONL file; a bad line is a PromptError naming it.

    A line is ``{"input_ids": [...]}``, ``{"text": "..."}``, or a conversation (``"messages"`` or
    ``"conversations"``) that ``chat`` renders with the target's chat template and its generation
    prompt, so the target answers it as the assistant.
    """
    if not path.is_file():
        raise PromptError(f"{path}: no such prompts file; pass a JSONL file with input_ids or text per line")
    prompts = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise PromptError(f"{path}:{number}: not JSON ({exc}); one JSON object per line") from exc
        if isinstance(row, dict) and isinstance(row.get("input_ids"), list):
            ids = [int(x) for x in row["input_ids"]]
        elif isinstance(row, dict) and isinstance(row.get("text"), str):
            if tokenize is None:
                raise PromptError(
                    f"{path}:{number}: text prompt but the target has no tokenizer; give input_ids instead"
                )
            ids = tokenize(row["text"])
        elif isinstance(row, dict) and ("messages" in row or "conversations" in row):
            from extractor.conversations import RowError, normalize_messages

            key = "messages" if "messages" in row else "conversations"
            if chat is None:
                raise PromptError(f"{path}:{number}: a conversation but the target has no chat template")
            try:
                ids = chat(normalize_messages(row[key], key))
            except RowError as exc:
                raise PromptError(f"{path}:{number}: {exc}") from None
        else:
            raise PromptError(
                f'{path}:{number}: expected {{"input_ids": [...]}}, {{"text": "..."}} '
                'or {"messages": [...]}'
            )
        if len(ids) >= 2:
            prompts.append(ids[-max_tokens:])
        if limit and len(prompts) >= limit:
            break
    if not prompts:
        raise PromptError(f"{path}: no prompt with at least 2 tokens")
    return prompts


def load_drafter(path: Path, target: Path):
    """An Eagle3Drafter from an export directory (or a training output directory, exported to a
    temporary directory first); returns (drafter, capture points or None)."""
    if not (path / "model.safetensors").is_file():
        import tempfile

        from trainer.export import export_checkpoint, resolve_checkpoint

        ckpt = resolve_checkpoint(path)
        with tempfile.TemporaryDirectory(prefix="hsmon-drafter-") as tmp:
            return _load_export(export_checkpoint(ckpt, tmp, "float32"), target)
    return _load_export(path, target)


def _load_export(path: Path, target: Path):
    from safetensors.torch import load_file

    from trainer.model import DrafterConfig, Eagle3Drafter
    from trainer.target import TargetError, load_embed_and_head

    config = json.loads((path / "config.json").read_text())
    cfg = DrafterConfig(
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_attention_heads=config["num_attention_heads"],
        num_key_value_heads=config["num_key_value_heads"],
        head_dim=config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"],
        vocab_size=config["vocab_size"],
        draft_vocab_size=config["draft_vocab_size"],
        num_aux=config.get("num_aux_hidden_states", 3),
        rms_norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_theta=config.get("rope_theta", 10000.0),
        max_position_embeddings=config.get("max_position_embeddings", 2048),
        # as SGLang reads them (`use_aux_norm` is its legacy name of fc_norm)
        fc_norm=bool(config.get("fc_norm") or config.get("use_aux_norm", False)),
        norm_output=bool(config.get("norm_output", False)),
    )
    drafter = Eagle3Drafter(cfg)
    state = {
        k: v.float() if v.is_floating_point() else v for k, v in load_file(path / "model.safetensors").items()
    }
    embed, _ = load_embed_and_head(target)
    if tuple(embed.shape) != (cfg.vocab_size, cfg.hidden_size):
        raise TargetError(
            f"{path}: this drafter was trained for a target with vocabulary {cfg.vocab_size} and hidden size "
            f"{cfg.hidden_size}; {target} has {embed.shape[0]} and {embed.shape[1]}: pass the --target-model "
            "it was trained on"
        )
    state["embed_tokens.weight"] = embed
    drafter.load_state_dict(state, strict=True)
    recorded = (config.get("hsmon_capture") or {}).get("capture_points")
    if recorded:  # the points it was trained on (its ids follow the serving class's rule)
        return drafter.eval(), [int(p) for p in recorded]
    layer_ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return drafter.eval(), (capture_points_of(layer_ids) if layer_ids else None)


def evaluate(
    drafter_dir: Path,
    target_dir: Path,
    prompts: list[list[int]],
    depth: int,
    max_new: int,
    ngram_max: int = 3,
    on_decode: Callable[[str | None, int | None, Any], None] | None = None,
    depths: list[int] | None = None,
    drafters: tuple[str, ...] = ("eagle3", "ngram"),
) -> dict[str, Any]:
    """Acceptance lengths of the EAGLE-3 drafter and the n-gram drafter for depths 1..depth;
    ``on_decode(drafter, depth, result)`` is called after each of the ``len(prompts) * (1 + 2 *
    depth)`` decodes (drafter and depth None for the target's own greedy decode; result a
    ``DecodeResult``: its tokens, rounds and accepted drafts).
    ``depths``/``drafters``: only these (bench/online.py measures eagle3 at depth 7 alone);
    ``per_prompt`` holds each prompt's [accepted, rounds] per drafter and depth (for a spread)."""
    drafter, points = load_drafter(drafter_dir, target_dir)
    target_config = json.loads((target_dir / "config.json").read_text())
    target = Target(target_dir, points or default_capture_points(int(target_config["num_hidden_layers"])))
    import torch

    delay = float(os.environ.get(DECODE_DELAY_ENV) or 0)  # tests: decodes that last, whatever the machine

    def decode(prompt: list[int], draft: Callable[[list[int], Any], list[int]], name: str | None = None,
               d: int | None = None) -> Any:
        if delay:
            time.sleep(delay)
        out = speculative_decode(target, prompt, max_new, draft)
        if on_decode is not None:
            on_decode(name, d, out)
        return out

    reference: list[list[int]] = [decode(p, lambda t, f: []).tokens for p in prompts]

    def eagle(d: int) -> Callable[[list[int], Any], list[int]]:
        def draft(tokens: list[int], features: Any) -> list[int]:
            next_ids = torch.tensor([tokens[1:]])
            return drafter.draft_chain(features, next_ids, d)

        return draft

    def ngram(d: int) -> Callable[[list[int], Any], list[int]]:
        return lambda tokens, features: ngram_draft(tokens, d, ngram_max)

    result: dict[str, Any] = {
        "arch": drafter.cfg.arch,
        "acceptance_length": {"eagle3": {}, "ngram": {}},
        "prompts": len(prompts),
        "max_new_tokens": max_new,
        "outputs_match_greedy": True,
        "greedy_outputs": reference,  # the target's own greedy tokens per prompt (what all variants equal)
        "per_prompt": {},
    }
    for name, make in (("eagle3", eagle), ("ngram", ngram)):
        if name not in drafters:
            continue
        per_depth, per_prompt = {}, {}
        for d in depths or range(1, depth + 1):
            rounds = accepted = 0
            per_prompt[str(d)] = []
            for prompt, ref in zip(prompts, reference, strict=True):
                out = decode(prompt, make(d), name, d)
                if out.tokens != ref:
                    result["outputs_match_greedy"] = False
                rounds += out.rounds
                accepted += out.accepted
                per_prompt[str(d)].append([out.accepted, out.rounds])
            # each round yields its accepted drafts plus the target's own token
            per_depth[str(d)] = (accepted + rounds) / max(rounds, 1)
        result["acceptance_length"][name] = per_depth
        result["per_prompt"][name] = per_prompt
    return result


def run(args: argparse.Namespace) -> int:
    """Measure; Ctrl-C, SIGTERM or a lost terminal (SIGHUP) end it in one line with 128 + the signal
    (nothing to save: an evaluation is measured again from the start), its events saying `stopped`."""
    previous = stop_signals.raise_on_stop()
    progress = EvalProgress(args)
    try:
        return _run(args, progress)
    except stop_signals.Interrupted as exc:
        progress.stopped(exc.signum)
        how = stop_signals.described(exc.signum)
        at = f" after {progress.done} of {progress.total} decodes" if progress.total else " while loading"
        stop_signals.say(f"hsmon eval-drafter: stopped by {how}{at}; nothing is saved: rerun to measure")
        return stop_signals.exit_status(exc.signum)
    finally:
        progress.close()
        stop_signals.restore(previous)


def _run(args: argparse.Namespace, progress: EvalProgress) -> int:
    import torch

    from trainer.target import TargetError, resolve_target, trained_for

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.depth < 1:
        print("hsmon eval-drafter: --depth must be at least 1", file=sys.stderr)
        return 2
    try:
        target_dir = resolve_target(args.target_model or trained_for(Path(args.drafter)))
        print(f"hsmon eval-drafter: loading the target {target_dir} and the drafter {args.drafter}",
              file=sys.stderr, flush=True)
        tokenize = chat = None
        try:
            from transformers import AutoTokenizer
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()  # one progress line of its own (trainer/eval_progress.py)

            tokenizer = AutoTokenizer.from_pretrained(target_dir)
            tokenize = lambda text: tokenizer(text)["input_ids"]  # noqa: E731
            if getattr(tokenizer, "chat_template", None):
                chat = lambda msgs: list(  # noqa: E731
                    tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True,
                                                  return_dict=True)["input_ids"]
                )
        except Exception:  # a target without a tokenizer: input_ids prompts still work
            tokenize = None
        sets = {}
        for path in args.prompts:
            name = Path(path).name.removesuffix(".jsonl")
            if name in sets:
                raise PromptError(f"{path}: a second prompt set named {name}; give the files other names")
            sets[name] = read_prompts(Path(path), tokenize, args.max_prompts, args.max_prompt_tokens, chat)
        drafter_dir = Path(args.drafter)
        if not drafter_dir.is_dir():
            raise PromptError(
                f"{drafter_dir}: no such drafter directory; pass the --out of `hsmon export-drafter`"
            )
        if args.engine in ("sglang", "vllm"):
            from trainer import engine_eval, engine_eval_vllm

            runner = engine_eval_vllm.run_engine if args.engine == "vllm" else engine_eval.run_engine
            return runner(args, sets, drafter_dir, target_dir, evaluate)
        progress.begin(drafter_dir, target_dir, sum(len(p) for p in sets.values()))
        results = {
            name: evaluate(drafter_dir, target_dir, prompts, args.depth, args.max_new_tokens, args.ngram_max,
                           progress.decoded)
            for name, prompts in sets.items()
        }
    except (PromptError, TargetError, FileNotFoundError) as exc:
        print(f"hsmon eval-drafter: {exc}", file=sys.stderr)
        progress.failed(str(exc))
        return 2
    # the first set's figures at the top (as with one --prompts), every set under "sets"
    result = {**next(iter(results.values())), "sets": results}
    progress.finished(result)
    if args.json:
        print(json.dumps(result))
        return 0
    print_tables(results, args.depth)
    return 0


def print_tables(results: dict[str, dict[str, Any]], depth: int) -> None:
    """One table per prompt set: acceptance length by depth, the drafter beside n-gram."""
    for name, res in results.items():
        print(
            f"{name} ({res['arch']} drafter): mean acceptance length (tokens per target forward), "
            f"{res['prompts']} prompts, {res['max_new_tokens']} new tokens each"
        )
        arch = str(res.get("arch") or "eagle3")  # the column names the architecture measured
        width = max(7, len(arch))
        print(f"{'depth':>5}  {arch:>{width}}  {'ngram':>7}")
        for d in range(1, depth + 1):
            print(
                f"{d:>5}  {res['acceptance_length']['eagle3'][str(d)]:>{width}.3f}  "
                f"{res['acceptance_length']['ngram'][str(d)]:>7.3f}"
            )
        if not res["outputs_match_greedy"]:
            print(f"WARNING: {name}: a speculative output differed from plain greedy decoding",
                  file=sys.stderr)

"""`hsmon regenerate` options. The work happens in extractor.regenerate.run (imported only when run)."""

from __future__ import annotations

import argparse

from extractor.regenerate.turns import REASONING_MODES

DEFAULT_MAX_NEW_TOKENS = 1024


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `hsmon regenerate`: extract's model and backend options, and the sampling."""
    from extractor.prepare import DEFAULT_MIN_FREE

    parser.add_argument("data", metavar="DATA.jsonl", help="dataset of conversations, as `hsmon extract` "
                        "reads it ({'conversations'} or {'messages'}; see docs/regenerate.md)")
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory: regenerated.jsonl "
                        "(the dataset, in source order), hsmon-regenerate.jsonl (the manifest)")
    parser.add_argument("--model", metavar="DIR", help="the target: a Hugging Face directory or a preset "
                        "(default: the embedded target); with --backend sglang, the tokenizer and chat "
                        "template of the model the servers run")
    parser.add_argument("--backend", default="hf", choices=["hf", "sglang"],
                        help="where answers come from: hf (transformers in-process) or sglang (SGLang "
                        "servers, see --url)")
    parser.add_argument("--temperature", type=float, default=0.0, metavar="T",
                        help="0 (default): greedy, reproducible; above 0: sampled, seeded per row")
    parser.add_argument("--top-p", type=float, default=1.0, metavar="P", help="nucleus sampling (default 1)")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, metavar="N",
                        help="longest answer; a longer one is cut and counted (default "
                        f"{DEFAULT_MAX_NEW_TOKENS})")
    parser.add_argument("--seed", type=int, default=0, metavar="N", help="base of the per-row seeds: each "
                        "answer's seed is derived from it, the row's id and the answer's place (default 0)")
    parser.add_argument("--truncated", choices=["keep", "reject"], default="keep",
                        help="an answer cut at --max-new-tokens: keep its row (default) or reject it")
    parser.add_argument("--reasoning", choices=list(REASONING_MODES), default="save",
                        help="a reasoning model's thinking: save (in reasoning_content, default), drop it, "
                        "or disable it (the chat template's enable_thinking=False)")
    parser.add_argument("--events", metavar="FILE", help="append progress events (JSON Lines) here "
                        "instead of stdout")
    parser.add_argument("--job", metavar="NAME", help="job id in the events "
                        "(default: regenerate-<out dir name>)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N (default auto)")
    parser.add_argument("--dtype", default="auto", help="auto (bf16 on GPU, fp32 on CPU), float32, bfloat16")
    parser.add_argument("--threads", type=int, metavar="N", help="CPU threads for the model "
                        "(default: torch's choice)")
    parser.add_argument("--min-free", default=DEFAULT_MIN_FREE, metavar="SIZE",
                        help=f"pause before a write would leave less free disk than this (default "
                        f"{DEFAULT_MIN_FREE})")
    parser.add_argument("--dry-run", action="store_true", help="print the rows, the answers to generate and "
                        "the source's answer tokens, then exit")
    parser.add_argument("--heartbeat", type=float, default=5.0, metavar="SECONDS", help="heartbeat interval")
    parser.add_argument("--disk-poll", type=float, default=2.0, metavar="SECONDS",
                        help="how often a disk pause checks for space")
    from extractor.backends.sglang.options import add_server_arguments

    group = parser.add_argument_group("backend sglang (docs/regenerate.md, section SGLang)")
    add_server_arguments(group, "the next answer")


WORKER_PREFIX = "hsmon-regenerate-"  # the names of extractor/regenerate/run.py's worker threads


def run(args: argparse.Namespace) -> int:
    """Entry point of `hsmon regenerate`."""
    import os
    import re
    import sys
    import threading

    from extractor.backend_options import REGENERATE_OPTIONS, misplaced_option

    refusal = misplaced_option(args, args.backend, REGENERATE_OPTIONS, add_arguments)
    if refusal is None and not re.fullmatch(r"auto|cpu|cuda(:\d+)?", args.device):
        refusal = f"--device {args.device!r} is not a device: give auto, cpu, cuda or cuda:N"
    if refusal is not None:
        print(f"hsmon regenerate: {refusal}", file=sys.stderr)
        return 2
    from extractor.regenerate.run import main

    code = main(args)
    if any(t.name.startswith(WORKER_PREFIX) and t.is_alive() for t in threading.enumerate()):
        # A stop came while an answer was being drawn (its worker is a daemon thread, never waited
        # for). Everything is written and closed by now: leave without the interpreter's finalization,
        # under which that thread, still inside torch, aborted the process ("terminate called without
        # an active exception", SIGABRT) in place of the exit status just recorded.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code

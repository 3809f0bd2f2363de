"""`hsmon extract` options. The work happens in extractor.run (imported only when run)."""

from __future__ import annotations

import argparse

# --dtype's names: auto and extractor.backends.hf.DTYPES' keys (here without torch: the parser loads fast)
DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16", "fp32", "bf16", "fp16")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `hsmon extract` (names fixed by the docs and scripts that call it)."""
    from extractor.prepare import DEFAULT_BATCH_TOKENS, DEFAULT_MIN_FREE

    parser.add_argument("data", metavar="DATA.jsonl", help="dataset: one JSON object per line "
                        "({'text'}, {'conversations'} or {'messages'}, or {'input_ids'}); "
                        "see docs/extract.md")
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory (rows_a-b/data_i.ckpt)")
    parser.add_argument("--model", metavar="DIR", help="Hugging Face causal-LM directory "
                        "(default: the embedded target, built on first use)")
    parser.add_argument("--backend", default="hf", choices=["hf", "sglang", "vllm"],
                        help="where hidden states come from: hf (transformers in-process), sglang "
                        "(SGLang servers, see --url) or vllm (vLLM servers of hsmon vllm-serve, --url)")
    parser.add_argument("--events", metavar="FILE", help="append progress events (JSON Lines) here "
                        "instead of stdout")
    parser.add_argument("--job", metavar="NAME", help="job id in the events "
                        "(default: extract-<out dir name>)")
    parser.add_argument("--layers", metavar="L1,L2,L3", help="capture points as hidden_states indices "
                        "(default: EAGLE-3's 2,N//2,N-3; SGLang layer id = point - 1)")
    parser.add_argument("--chunk-size", type=int, default=2000, metavar="N",
                        help="rows per rows_a-b directory")
    parser.add_argument("--max-length", type=int, metavar="N", help="truncate rows to N tokens "
                        "(default: the model's maximum positions)")
    parser.add_argument("--no-truncate", action="store_true", help="reject rows longer than --max-length "
                        "instead of truncating them")
    parser.add_argument("--batch-tokens", type=int, default=DEFAULT_BATCH_TOKENS, metavar="N",
                        help="token budget of a batch, padding included")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N (default auto)")
    parser.add_argument("--dtype", default="auto", choices=DTYPE_NAMES, metavar="DTYPE",
                        help="auto (the computing engine's: bf16 on GPU, fp32 on CPU in-process), float32, "
                        "bfloat16 or float16 (fp32, bf16, fp16)")
    parser.add_argument("--threads", type=int, metavar="N", help="CPU threads for the model "
                        "(default: torch's choice; 1 is often fastest on a small shared machine)")
    parser.add_argument("--min-free", default=DEFAULT_MIN_FREE, metavar="SIZE",
                        help="pause before a write would leave less free disk than this "
                        f"(default {DEFAULT_MIN_FREE})")
    parser.add_argument("--spool-max", metavar="SIZE",
                        help="the output is a spool that `hsmon train --follow` consumes: pause (reason "
                        "spool) while the rows not yet consumed would exceed SIZE, e.g. 20GB "
                        "(docs/extract.md, Online)")
    parser.add_argument("--shard", metavar="I/N", help="do only shard I of N (0-based; whole chunks each); "
                        "default from torchrun, a Slurm array or a Kubernetes Indexed Job (docs/extract.md)")
    parser.add_argument("--dry-run", action="store_true", help="print rows, tokens, bytes and whether they "
                        "fit, then exit (1 when they do not fit)")
    parser.add_argument("--heartbeat", type=float, default=5.0, metavar="SECONDS", help="heartbeat interval")
    parser.add_argument("--disk-poll", type=float, default=2.0, metavar="SECONDS",
                        help="how often a disk pause checks for space")
    parser.add_argument("--spool-poll", type=float, default=0.1, metavar="SECONDS",
                        help="how often a spool pause (--spool-max) checks the trainer's ledger for room "
                             "(a stat per file when idle; room comes back at the trainer's step pace)")
    from extractor.backends.sglang.options import add_arguments as add_sglang_arguments

    add_sglang_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Entry point of `hsmon extract`."""
    import os
    import re
    import sys

    from extractor.backend_options import EXTRACT_OPTIONS, misplaced_option
    from extractor.shard_env import ShardEnvError, resolve_shard, visible_device_for_rank

    refusal = misplaced_option(args, args.backend, EXTRACT_OPTIONS, add_arguments)
    if refusal is None and not re.fullmatch(r"auto|cpu|cuda(:\d+)?", args.device):
        refusal = f"--device {args.device!r} is not a device: give auto, cpu, cuda or cuda:N"
    if refusal is not None:
        print(f"hsmon extract: {refusal}", file=sys.stderr)
        return 2
    try:
        args.shard = resolve_shard(args.shard, os.environ)
        visible = visible_device_for_rank(args.device, os.environ)
    except ShardEnvError as exc:
        print(f"hsmon extract: {exc}", file=sys.stderr)
        return 2
    if visible is not None:  # before torch is imported: one GPU per torchrun rank on a host
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
    from extractor.run import main

    return main(args)

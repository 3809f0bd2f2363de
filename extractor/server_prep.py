"""`hsmon extract` with a server backend (sglang, vllm): its options checked and its servers asked before
the dataset is read (they decide how long a row may be and, with --dtype auto, the dtype stored)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def server_dtype(dtype: str) -> str | None:
    """--dtype for a server backend (sglang, vllm): the dtype asked for, or None for auto (what the servers
    compute in, agreed in the preflight)."""
    from extractor.backends.hf import DTYPES

    if dtype == "auto":
        return None
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r}: use auto, float32 (fp32), bfloat16 (bf16) or float16")
    return str(DTYPES[dtype]).removeprefix("torch.")


def server_options(args: argparse.Namespace, job: str, out: Path, layers: list[int], dtype: str | None,
                   config: Any, max_pos: int) -> tuple[Any, int, str]:
    """A server backend's options, preflighted: (options, the run's --max-length, the dtype it stores)."""
    from extractor.backends.hf import model_facts

    if args.backend == "vllm":
        from extractor.backends.vllm import options as vllm_options

        opts = vllm_options.build(args, job, str(out.resolve()))
        return opts, *vllm_options.check_servers(opts, layers, dtype, args.max_length, max_pos,
                                                 model_facts(config)[1])
    from extractor.backends.sglang import options

    opts = options.build(args, job, longest_row=1)
    return opts, *options.check_servers(opts, layers, dtype, config, args.max_length, max_pos)

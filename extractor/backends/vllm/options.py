"""`hsmon extract --backend vllm` options: the sglang client's server options (--url, --concurrency,
timeouts, --row-attempts, --wait-for-server, the dump directory's limits), checked here. vLLM decides
where its files go (vllm-serve --dump-dir), so --transport and --dump-dir are the sglang backend's."""

from __future__ import annotations

import argparse
import hashlib
from dataclasses import dataclass

from extractor.backends.sglang.options import SGLangOptions
from extractor.errors import UsageError


@dataclass
class VLLMOptions(SGLangOptions):
    """The sglang client's options, with ``tag``: this job's mark in its request ids (and so in the
    names of vLLM's files), which lets a resumed run find and remove what an earlier one left."""

    tag: str = ""


def build(args: argparse.Namespace, job: str, out: str) -> VLLMOptions:
    from extractor.backends.sglang.options import check_urls
    from hsmon.contracts.units import parse_size

    if not args.url:
        raise UsageError(
            "--backend vllm needs --url http://HOST:PORT (a server of hsmon vllm-serve; repeat for several)"
        )
    urls = check_urls(args.url)
    try:
        max_dump, min_free = parse_size(args.max_dump_bytes), parse_size(args.dump_min_free)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.concurrency < 0 or args.request_timeout <= 0 or args.give_up_after <= 0 or args.row_attempts < 1:
        raise UsageError(
            "--concurrency must be >= 0, --request-timeout and --give-up-after > 0, --row-attempts >= 1"
        )
    tag = hashlib.sha1(f"{job}\0{out}".encode()).hexdigest()[:10]
    return VLLMOptions(
        urls=urls,
        transport="vllm",
        dump_dir=None,
        concurrency=args.concurrency,
        max_dump_bytes=max_dump,
        dump_min_free=min_free,
        request_timeout=args.request_timeout,
        give_up_after=args.give_up_after,
        longest_row=1,
        row_attempts=args.row_attempts,
        wait_for_server=max(0.0, args.wait_for_server),
        tag=tag,
    )


def check_servers(
    opts: VLLMOptions,
    layers: list[int],
    dtype: str | None,
    max_length: int | None,
    max_positions: int,
    hidden: int,
) -> tuple[int, str]:
    """Preflight every server (PreflightError on one that cannot serve this run); the run's
    --max-length and the dtype it stores (``dtype``, or with None the servers' own)."""
    from extractor.backends.sglang.preflight import resolve_max_length
    from extractor.backends.vllm import preflight

    opts.facts = preflight.check_servers(
        opts.urls, layers, dtype, hidden, timeout=min(opts.request_timeout, 30.0), wait_s=opts.wait_for_server
    )
    return resolve_max_length(max_length, opts.facts, max_positions), str(opts.facts[0].computes)

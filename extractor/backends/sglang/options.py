"""`hsmon extract --backend sglang` options: declared here (no heavy imports), checked into
:class:`SGLangOptions` by :func:`build` when the run is prepared."""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from extractor.backends.sglang.dumpdir import check_private, owner_of
from extractor.errors import UsageError

DEFAULT_DUMP_ROOT = "/dev/shm/hsmon"
DEFAULT_MAX_DUMP = "2G"
DEFAULT_DUMP_MIN_FREE = "1G"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`hsmon extract`'s backend sglang options: the servers', then the capture's own."""
    group = parser.add_argument_group("backend sglang (docs/extract.md, section SGLang)")
    add_server_arguments(group, "the next request")
    group.add_argument("--transport", choices=["json", "shm"], default="shm",
                       help="hidden states in the HTTP response (json) or as files in --dump-dir "
                       "(shm, default)")
    group.add_argument("--dump-dir", metavar="DIR", help=f"where the server dumps files for --transport shm "
                       f"(default {DEFAULT_DUMP_ROOT}/<job>)")
    group.add_argument("--max-dump-bytes", default=DEFAULT_MAX_DUMP, metavar="SIZE",
                       help=f"no new request while the dump dir holds more (default {DEFAULT_MAX_DUMP})")
    group.add_argument("--dump-min-free", default=DEFAULT_DUMP_MIN_FREE, metavar="SIZE",
                       help=f"no new request while the dump dir's filesystem has less free (default "
                       f"{DEFAULT_DUMP_MIN_FREE})")
    group.add_argument("--skip-first-chunk-check", action="store_true",
                       help="a server on an untested SGLang release (sglang-serve --allow-untested-sglang): "
                       "do not check the first chunk against transformers (hsmon verify-data, on by "
                       "default for such a server)")


def add_server_arguments(group: Any, unit: str) -> None:
    """The options of the servers behind ``--url`` (the pool: extractor/backends/sglang/pool.py), the
    same for every client of SGLang's /generate; ``unit``: what the least loaded server gets."""
    group.add_argument("--url", action="append", default=[], metavar="URL",
                       help=f"SGLang server (repeat for data-parallel servers; the least loaded gets {unit})")
    group.add_argument("--concurrency", type=int, default=0, metavar="N",
                       help="requests in flight over all servers (default: chosen from the servers' info)")
    group.add_argument("--request-timeout", type=float, default=600.0, metavar="SECONDS",
                       help="one request's time limit; a timeout is retried (default 600)")
    group.add_argument("--give-up-after", type=float, default=600.0, metavar="SECONDS",
                       help="stop with an error after this long with every server failing (default 600)")
    group.add_argument("--wait-for-server", type=float, default=0.0, metavar="SECONDS",
                       help="before the first row, wait up to this long for a server that does not "
                       "answer yet (one still loading its model; a line every 30 s); default 0: refuse "
                       "at once")
    group.add_argument("--row-attempts", type=int, default=3, metavar="N",
                       help="reject a row after N failures (5xx, timeouts) while its server answers a "
                       "control request (default 3)")


DUMP_WAIT_ENV = "HSMON_DUMP_WAIT_S"


@dataclass
class SGLangOptions:
    """`hsmon extract --backend sglang` options (see extractor/cli.py)."""

    urls: list[str]
    transport: str = "shm"
    dump_dir: str | None = None
    concurrency: int = 0  # 0: chosen from the servers' info
    max_dump_bytes: int = 2 << 30
    dump_min_free: int = 1 << 30
    request_timeout: float = 600.0
    give_up_after: float = 600.0
    longest_row: int = 1
    row_attempts: int = 3  # failures of one row while its server serves others: then rejected
    wait_for_server: float = 0.0  # the preflight's wait for a server that does not answer yet
    # seconds from the response to the file's rename (the plugin's writer thread may lag behind)
    dump_wait: float = field(default_factory=lambda: float(os.environ.get(DUMP_WAIT_ENV) or 120.0))
    facts: list[Any] | None = None  # the preflight's, when it ran before the backend (prepare)
    dump_owner: str = ""  # the output directory's mark in its dump files' names (dumpdir.owner_of)


def _usage(message: str) -> Exception:
    return UsageError(message)


def check_urls(urls: list[str]) -> list[str]:
    """Normalized server URLs (no trailing slash); UsageError for a missing or malformed one."""
    if not urls:
        raise _usage("--backend sglang needs --url http://HOST:PORT (the SGLang server; repeat for several)")
    out = []
    for url in urls:
        if not re.match(r"^https?://[^/\s]+", url):
            raise _usage(f"--url {url!r}: give the server as http://HOST:PORT")
        out.append(url.rstrip("/"))
    if len(set(out)) != len(out):
        raise _usage(f"--url: a server is given twice ({out})")
    return out


def config_dtype(config: Any) -> str:
    """The dtype the model's config declares (what SGLang's ``--dtype auto`` starts from)."""
    value = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    name = str(value).removeprefix("torch.") if value is not None else "float32"
    return name if name in ("float32", "bfloat16", "float16") else "float32"


def check_servers(opts: Any, layers: list[int], dtype: str | None, config: Any, max_length: int | None,
                  max_positions: int) -> tuple[int, str]:
    """Preflight every server (PreflightError, exit 2, on one that cannot serve this run), keep
    their facts in ``opts``; return the run's ``--max-length`` (the explicit one if a server
    accepts it, else the longest input the smallest server accepts) and the dtype it stores:
    ``dtype``, or with None (``--dtype auto``) the one the servers compute in."""
    from extractor.backends.sglang import preflight

    auto = preflight.sglang_auto_dtype(config_dtype(config), str(getattr(config, "model_type", "") or ""))
    opts.facts = preflight.check_servers(opts.urls, layers, opts.transport, dtype, opts.dump_dir,
                                         timeout=min(opts.request_timeout, 30.0), wait_s=opts.wait_for_server,
                                         auto_dtype=auto)
    stored = dtype or str(opts.facts[0].computes)
    return preflight.resolve_max_length(max_length, opts.facts, max_positions), stored


def build(args: argparse.Namespace, job: str, longest_row: int) -> SGLangOptions:
    """Check the options and return SGLangOptions (UsageError on bad ones)."""
    from hsmon.contracts.units import parse_size

    urls = check_urls(args.url)
    transport = getattr(args, "transport", "shm")  # `hsmon regenerate` has no capture options
    try:
        max_dump = parse_size(getattr(args, "max_dump_bytes", DEFAULT_MAX_DUMP))
        min_free = parse_size(getattr(args, "dump_min_free", DEFAULT_DUMP_MIN_FREE))
    except ValueError as exc:
        raise _usage(str(exc)) from None
    if args.concurrency < 0 or args.request_timeout <= 0 or args.give_up_after <= 0 or args.row_attempts < 1:
        raise _usage("--concurrency must be >= 0, --request-timeout and --give-up-after > 0, "
                     "--row-attempts >= 1")
    dump_dir = None
    if transport == "shm" and hasattr(args, "dump_dir"):
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", job)
        dump_dir = args.dump_dir or f"{DEFAULT_DUMP_ROOT}/{safe}"
        if not dump_dir.startswith("/"):
            raise _usage(f"--dump-dir {dump_dir}: give an absolute path (the server resolves it on its side)")
        refused = check_private(Path(dump_dir))
        if refused:
            raise _usage(refused)
    owner = owner_of(args.out) if getattr(args, "out", None) else ""
    return SGLangOptions(urls=urls, transport=transport, dump_dir=dump_dir, dump_owner=owner,
                         concurrency=args.concurrency, max_dump_bytes=max_dump, dump_min_free=min_free,
                         request_timeout=args.request_timeout, give_up_after=args.give_up_after,
                         longest_row=longest_row, row_attempts=args.row_attempts,
                         wait_for_server=max(0.0, args.wait_for_server))

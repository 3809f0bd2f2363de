"""`hsmon tui`: the terminal dashboard, from daemons (--url) or trackers run in-process (paths)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

DEFAULT_REFRESH_S = 1.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `hsmon tui`."""
    parser.add_argument("--url", action="append", default=[], metavar="URL",
                        help="a daemon to read (repeatable: a tab per job and host), e.g. http://127.0.0.1:9108")
    parser.add_argument("--token", default=None,
                        help="the daemons' token for launching and stopping (default: $HSMON_TOKEN)")
    parser.add_argument("--refresh", type=float, default=DEFAULT_REFRESH_S, metavar="SECONDS",
                        help=f"how often to read each source (default {DEFAULT_REFRESH_S:g})")
    parser.add_argument("--status-file", default=None, metavar="FILE",
                        help="show a saved `hsmon status --json` document instead of live sources")
    local = parser.add_argument_group("in-process trackers (when no daemon runs)")
    local.add_argument("--config", default=None, help="a hsmon.toml of jobs, as for `hsmon daemon`")
    local.add_argument("--job", default=None, help="job name (default: extract)")
    local.add_argument("--dump-dir", default=None, help="dump directory to watch, e.g. /dev/shm/sglang_hs")
    local.add_argument("--out", default=None, help="the extraction output directory")
    local.add_argument("--events", default=None, help="the job's events file (JSON Lines)")
    who = local.add_mutually_exclusive_group()
    who.add_argument("--pid", type=int, default=None, help="the job's process id")
    who.add_argument("--pidfile", default=None, help="a file holding the job's process id")
    who.add_argument("--match", default=None, metavar="REGEX", help="find the job's processes by cmdline")
    local.add_argument("--stall-after", type=float, default=None, metavar="SECONDS",
                       help="call a live job stalled after this long without any signal")


def has_local_paths(args: argparse.Namespace) -> bool:
    return any(getattr(args, name) is not None
               for name in ("config", "dump_dir", "out", "events", "pid", "pidfile", "match"))


def local_job_configs(args: argparse.Namespace) -> list[Any]:
    """JobConfigs from the path options, built the way `hsmon daemon` builds them."""
    from hsmon import config

    builder = getattr(config, "job_configs_from_args", None)
    if callable(builder):
        return list(builder(args))
    fields = {"job": args.job or "extract", "dump_dir": args.dump_dir, "out": args.out, "events": args.events,
              "pid": args.pid, "pidfile": args.pidfile, "match": args.match}
    if args.stall_after is not None:
        fields["stall_after"] = args.stall_after
    return [config.JobConfig(**fields)]


def build_sources(args: argparse.Namespace) -> list[Any]:
    """The sources the options ask for; raises ValueError naming the bad option."""
    from hsmon.tui.sources import FixedSource, HttpStatusSource, InProcessSource

    if args.refresh <= 0:
        raise ValueError(f"--refresh {args.refresh}: must be a positive number of seconds")
    token = args.token or os.environ.get("HSMON_TOKEN") or None
    sources: list[Any] = []
    if args.status_file:
        try:
            sources.append(FixedSource.from_file(args.status_file))
        except (OSError, ValueError) as exc:
            raise ValueError(f"--status-file {args.status_file}: {exc}") from exc
    for url in args.url:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--url {url}: give a full URL such as http://127.0.0.1:9108")
        sources.append(HttpStatusSource(url, token=token, interval=args.refresh))
    if has_local_paths(args):
        sources.append(InProcessSource(local_job_configs(args), interval=args.refresh))
    if not sources:
        raise ValueError("nothing to show: give --url URL of a daemon, or paths (--out, --dump-dir, "
                         "--events, --pid) to watch in-process")
    return sources


def run(args: argparse.Namespace) -> int:
    """Start the dashboard; returns when the user quits."""
    try:
        sources = build_sources(args)
    except ValueError as exc:
        print(f"hsmon tui: {exc}", file=sys.stderr)
        return 2
    from hsmon.tui.app import HsmonApp

    HsmonApp(sources).run()
    return 0

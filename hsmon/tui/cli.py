"""`hsmon tui`: the terminal dashboard, from daemons (--url) or trackers run in-process (paths)."""

from __future__ import annotations

import argparse
import gc
import os
import sys
from typing import Any

from hsmon.core import config as cfgmod

DEFAULT_REFRESH_S = 1.0
DEFAULT_URL = f"http://{cfgmod.DEFAULT_HOST}:{cfgmod.DEFAULT_PORT}"  # as `hsmon status`: the daemon's default
GC_YOUNG_THRESHOLD = 20_000  # allocations between two collections of the young generation (default 700)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `hsmon tui`."""
    parser.add_argument("--url", action="append", default=[], metavar="URL",
                        help=f"a daemon to read (repeatable: a tab per job and host); default {DEFAULT_URL} "
                        "when no path option is given, as for hsmon status")
    parser.add_argument("--token-file", default=None, metavar="FILE",
                        help="file holding the daemons' control token, for launching and stopping "
                             "(default: $HSMON_CONTROL_TOKEN)")
    parser.add_argument("--insecure-plain-http", action="store_true",
                        help="send the control token to an http:// daemon on another machine anyway (in "
                             "clear text; refused by default: use https://)")
    parser.add_argument("--ca", metavar="FILE", help="check https:// daemons' certificates against this PEM "
                        "file (their CA, or a self-signed certificate itself)")
    parser.add_argument("--refresh", type=float, default=DEFAULT_REFRESH_S, metavar="SECONDS",
                        help=f"how often to read each source (default {DEFAULT_REFRESH_S:g})")
    parser.add_argument("--status-file", default=None, metavar="FILE",
                        help="show a saved `hsmon status --json` document instead of live sources")
    local = parser.add_argument_group("in-process trackers (when no daemon runs; as for `hsmon daemon`)")
    local.add_argument("--config", default=None, help="a hsmon.toml with [[job]] tables")
    from hsmon.job_flags import add_job_arguments

    add_job_arguments(local)


def local_job_configs(args: argparse.Namespace) -> list[Any]:
    """JobConfigs from --config and the path options, built the way `hsmon daemon` builds them."""
    from hsmon import job_flags
    from hsmon.core import config

    jobs = list(config.load_toml(args.config).jobs) if args.config else []
    job = job_flags.job_from_args(args)
    if job is not None:
        jobs.append(job)
    return jobs


def read_token(path: str | None) -> str | None:
    """The control token: first line of ``path``, else $HSMON_CONTROL_TOKEN; None when neither."""
    if path:
        try:
            with open(path, encoding="utf-8") as fh:
                return fh.readline().strip() or None
        except OSError as exc:
            raise ValueError(f"--token-file {path}: {exc.strerror}; give a readable file") from exc
    return os.environ.get("HSMON_CONTROL_TOKEN", "").strip() or None


def build_sources(args: argparse.Namespace) -> list[Any]:
    """The sources the options ask for; raises ValueError naming the bad option."""
    from hsmon.status.client import check_token_transport, check_url
    from hsmon.tui.sources import FixedSource, HttpStatusSource, InProcessSource

    if args.refresh <= 0:
        raise ValueError(f"--refresh {args.refresh}: must be a positive number of seconds")
    token = read_token(args.token_file)
    sources: list[Any] = []
    if args.status_file:
        try:
            sources.append(FixedSource.from_file(args.status_file))
        except OSError as exc:
            raise ValueError(f"--status-file {args.status_file}: {exc.strerror}; give the output of "
                             "`hsmon status --json`") from exc
        except ValueError as exc:
            raise ValueError(f"--status-file {args.status_file}: not a JSON status document ({exc})") from exc
    for url in args.url:
        check_token_transport(check_url(url), token, args.insecure_plain_http)
        sources.append(HttpStatusSource(url, token=token, interval=args.refresh, ca=args.ca))
    from hsmon.core.config import ConfigError

    try:
        jobs = local_job_configs(args)
    except ConfigError as exc:
        raise ValueError(str(exc)) from exc
    if jobs:
        sources.append(InProcessSource(jobs, interval=args.refresh))
    if not sources:  # as `hsmon status`: the daemon of this machine, on its default port
        sources.append(HttpStatusSource(DEFAULT_URL, token=token, interval=args.refresh, ca=args.ca))
    return sources


def quiet_gc() -> None:
    """Fewer garbage collections in the dashboard's process: a redraw allocates thousands of short-lived
    objects (strips, segments, styles), so the default threshold (700) ran the young generation's
    collection three to four times a redraw, about a millisecond each time; the modules and classes
    loaded by now are frozen out of every collection."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def run(args: argparse.Namespace) -> int:
    """Start the dashboard; returns when the user quits."""
    try:
        sources = build_sources(args)
    except ValueError as exc:
        print(f"hsmon tui: {exc}", file=sys.stderr)
        return 2
    from hsmon.tui.app import HsmonApp

    # COLUMNS/LINES in the environment pin the size Textual reads, so the dashboard would never follow
    # a resize (tmux under some launchers exports them): the terminal itself is the truth.
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)
    quiet_gc()
    HsmonApp(sources).run()
    return 0

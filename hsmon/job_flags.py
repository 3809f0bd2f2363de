"""The command-line flags that describe one job (`hsmon daemon`, `hsmon status`, `hsmon tui`), and
the JobConfig they make."""

from __future__ import annotations

import argparse
import os
import re

from hsmon.core.config import (
    DEFAULT_BUSY_AFTER,
    DEFAULT_HEALTH_INTERVAL,
    DEFAULT_HEALTH_TIMEOUT,
    DEFAULT_SERVER_INTERVAL,
    DEFAULT_STALL_AFTER,
    JOB_KINDS,
    PROCESS_ROLES,
    JobConfig,
)


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """The path/process options shared by `hsmon daemon` and `hsmon status`."""
    parser.add_argument("--job", metavar="NAME", help="job name (default: the events' job id or 'job')")
    parser.add_argument("--kind", choices=JOB_KINDS, default="external", help="what the job is")
    parser.add_argument("--dump-dir", metavar="DIR", help="dump directory to watch (e.g. /dev/shm/sglang_hs)")
    parser.add_argument(
        "--out", metavar="DIR", help="output directory (hsmon, SpecForge or speculators layout)"
    )
    parser.add_argument("--events", metavar="FILE", help="progress events file (JSON Lines) to tail")
    who = parser.add_mutually_exclusive_group()
    who.add_argument("--pid", type=int, metavar="N", help="PID of the job's process")
    who.add_argument("--pidfile", metavar="FILE", help="file holding the job's PID")
    who.add_argument("--match", metavar="REGEX", help="find the job's process by command-line regex")
    parser.add_argument("--role", choices=PROCESS_ROLES, help="role of that process (default from --kind)")
    parser.add_argument(
        "--stall-after",
        type=float,
        default=DEFAULT_STALL_AFTER,
        metavar="SECONDS",
        help=f"no signal moved for this long: stalled (default {DEFAULT_STALL_AFTER:.0f})",
    )
    parser.add_argument(
        "--rows-total", type=int, metavar="N", help="rows the job will write, if no events say"
    )
    parser.add_argument(
        "--server",
        action="append",
        default=[],
        metavar="URL",
        help="an inference server the job talks to (repeatable; an `hsmon extract --backend sglang` "
        "job's start event names its own)",
    )
    parser.add_argument(
        "--server-interval",
        type=float,
        default=DEFAULT_SERVER_INTERVAL,
        metavar="SECONDS",
        help=f"liveness and load of each server (default {DEFAULT_SERVER_INTERVAL:g})",
    )
    parser.add_argument(
        "--health-interval",
        type=float,
        default=DEFAULT_HEALTH_INTERVAL,
        metavar="SECONDS",
        help=f"a real forward (/health_generate) per server (default {DEFAULT_HEALTH_INTERVAL:g})",
    )
    parser.add_argument(
        "--health-timeout",
        type=float,
        default=DEFAULT_HEALTH_TIMEOUT,
        metavar="SECONDS",
        help="no forward completed for this long (checks unanswered, no counter or row moving): the "
        f"server is hung; its front silent this long: down (default {DEFAULT_HEALTH_TIMEOUT:g})",
    )
    parser.add_argument(
        "--busy-after",
        type=float,
        default=DEFAULT_BUSY_AFTER,
        metavar="SECONDS",
        help=f"a forward slower than this (but back): the server is busy (default {DEFAULT_BUSY_AFTER:g})",
    )


def job_from_args(args: argparse.Namespace) -> JobConfig | None:
    """A JobConfig from flags, or None when no path or process option was given."""
    keys = ("dump_dir", "out", "events", "pid", "pidfile", "match", "server")
    if not any(getattr(args, k, None) for k in keys):
        return None
    named = args.job or _job_id_from_events(args.events)
    job = JobConfig(
        name=named or "job",
        name_from_events=not named and bool(args.events),
        kind=args.kind,
        dump_dir=_abs(args.dump_dir),
        out_dir=_abs(args.out),
        events=_abs(args.events),
        pid=args.pid,
        pidfile=_abs(args.pidfile),
        match=args.match,
        role=args.role,
        server_interval=getattr(args, "server_interval", DEFAULT_SERVER_INTERVAL),
        health_interval=getattr(args, "health_interval", DEFAULT_HEALTH_INTERVAL),
        health_timeout=getattr(args, "health_timeout", DEFAULT_HEALTH_TIMEOUT),
        busy_after=getattr(args, "busy_after", DEFAULT_BUSY_AFTER),
        stall_after=args.stall_after,
        rows_total=args.rows_total,
    )
    if getattr(args, "server", None):
        # looked at with the job's intervals, as the servers a start event names will be
        job.servers = [job.server_spec(url) for url in args.server]
        job.validate()
    return job


def _job_id_from_events(path: str | None) -> str | None:
    """The job id of the first valid event in the file's first 64 KB (None if there is none)."""
    if not path:
        return None
    from hsmon.contracts.events import parse_event_line

    try:
        with open(path, "rb") as fh:
            head = fh.read(65536)
    except OSError:
        return None
    for line in head.split(b"\n")[:-1]:
        event = parse_event_line(line)
        job = event.get("job") if event else None
        if isinstance(job, str) and re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", job):
            return job
    return None


def _abs(path: str | None) -> str | None:
    return os.path.abspath(path) if path else None

"""`hsmon daemon`: watch jobs; serve /metrics, /api/v1/status and /healthz.

Control endpoints (start or stop work) are off unless a token is configured
(``--control-token-file FILE`` or env HSMON_CONTROL_TOKEN); they need ``Authorization: Bearer TOKEN``:
    POST /api/v1/train              JSON body: the fields of hsmon.launch.training.validate_training_request
    POST /api/v1/jobs/<job>/stop    SIGTERM to the job's process (a trainer checkpoints, then exits)
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from typing import Any

from hsmon import job_flags
from hsmon.contracts.layout import atomic_write
from hsmon.contracts.port_holder import port_refusal
from hsmon.contracts.units import port_number
from hsmon.core import config as cfgmod
from hsmon.core import verify_watch
from hsmon.daemon import security
from hsmon.daemon.api import DaemonServer
from hsmon.daemon.http_pool import raise_fd_limit
from hsmon.daemon.memory_trim import MemoryTrim

log = logging.getLogger("hsmon.daemon")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="hsmon.toml with [daemon] and [[job]] tables")
    job_flags.add_job_arguments(parser)
    verify_watch.add_arguments(parser)
    parser.add_argument("--host", default=None, help=f"address to bind (default {cfgmod.DEFAULT_HOST})")
    parser.add_argument(
        "--port", type=port_number, default=None, metavar="PORT",
        help=f"port, 0-65535 (default {cfgmod.DEFAULT_PORT}; 0: any)",
    )
    parser.add_argument(
        "--scan-interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"reconciliation scan period (default {cfgmod.DEFAULT_SCAN_INTERVAL})",
    )
    parser.add_argument(
        "--client-timeout", type=float, default=None, metavar="SECONDS",
        help=f"close a connection idle this long; a request's head and body must come within "
        f"min(10, SECONDS) (default {cfgmod.DEFAULT_CLIENT_TIMEOUT:g})",
    )
    parser.add_argument(
        "--notify-webhook", metavar="URL", help="POST on transitions to stalled/dead/paused/done"
    )
    parser.add_argument(
        "--notify-format", choices=("json", "slack"), default=None, help="webhook body format"
    )
    parser.add_argument(
        "--notify-repeat",
        type=float,
        default=None,
        metavar="SECONDS",
        help="repeat a notification while the job stays in that state (default 3600)",
    )
    parser.add_argument(
        "--control-token-file",
        metavar="FILE",
        help="enable POST /api/v1/train and /api/v1/jobs/JOB/stop with this bearer token",
    )
    parser.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this PEM certificate (chain)")
    parser.add_argument("--tls-key", metavar="FILE", help="the private key of --tls-cert (PEM)")
    parser.add_argument(
        "--allow-root", action="append", dest="allow_roots", metavar="DIR",
        help="trainings launched through the API may read and write only under DIR (repeatable; "
        "needed with a control token on a non-loopback --host)",
    )
    parser.add_argument(
        "--state-log", metavar="FILE", help="append state-transition events here (default stderr)"
    )
    parser.add_argument("--port-file", metavar="FILE", help="write the bound port here once listening")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")


def build_config(args: argparse.Namespace) -> cfgmod.DaemonConfig:
    """Merge the TOML file and flags (flags win)."""
    cfg = cfgmod.load_toml(args.config) if args.config else cfgmod.DaemonConfig()
    job = job_flags.job_from_args(args)
    try:
        verify = verify_watch.spec_from_args(args)
    except ValueError as exc:
        raise cfgmod.ConfigError(str(exc)) from None
    if verify is not None:
        if job is None:
            raise cfgmod.ConfigError("--verify-every checks the job given by flags: give its --out too")
        job.verify = verify
        job.validate()
    if job is not None:
        if any(j.name == job.name for j in cfg.jobs):
            raise cfgmod.ConfigError(f"--job {job.name}: a job of that name is already in {args.config}")
        cfg.jobs.append(job)
    for key in sorted(cfgmod.DAEMON_KEYS):
        value = getattr(args, key, None)
        if value is not None:
            setattr(cfg, key, value)
    cfg.validate(args.config)
    return cfg


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        cfg = build_config(args)
        token = security.read_control_token(cfg.control_token_file)
        roots = security.resolved_roots(cfg.allow_roots)
        security.check_exposure(cfg.host, token, roots)
        tls = security.tls_context(cfg.tls_cert, cfg.tls_key)
    except cfgmod.ConfigError as exc:
        print(f"hsmon daemon: {exc}", file=sys.stderr)
        return 2
    from hsmon.contracts import events as ev
    from hsmon.core.monitor import Monitor
    from hsmon.daemon.notify import NotifierSlot
    from hsmon.daemon.scrape_latency import settle_for_serving
    from hsmon.metrics.exporter import MetricsEndpoint

    if not cfg.jobs and token is None:
        print(
            "hsmon daemon: nothing to watch: give --dump-dir/--out/--events/--pid/--pidfile/--match, "
            "or --config FILE with [[job]] tables (or a control token to launch trainings)",
            file=sys.stderr,
        )
        return 2
    taken = port_refusal(cfg.host, cfg.port, "--port (0: any free port)")
    if taken:  # before anything starts: one line naming the holder, never a traceback
        print(f"hsmon daemon: {taken}", file=sys.stderr)
        return 2
    state_stream = open(args.state_log, "a", encoding="utf-8") if args.state_log else sys.stderr  # noqa: SIM115
    state_lock = threading.Lock()

    def state_log(event: dict[str, Any]) -> None:
        with state_lock:
            state_stream.write(ev.encode_event(event))
            state_stream.flush()

    settle_for_serving()
    monitor = Monitor(cfg.jobs, scan_interval=cfg.scan_interval, source="daemon", event_log=state_log)
    notifier = NotifierSlot()  # a reload may start, change or stop the webhook
    try:
        notifier.configure(cfg.notify_webhook, cfg.notify_format, cfg.notify_repeat)
    except ValueError as exc:
        print(f"hsmon daemon: {exc}", file=sys.stderr)
        return 2
    monitor.add_listener(notifier)
    metrics = MetricsEndpoint(monitor, notifier)
    monitor.add_tick_listener(MemoryTrim())
    raise_fd_limit()  # connections are capped below it (hsmon/daemon/http_pool.py)
    try:
        server = DaemonServer((cfg.host, cfg.port), monitor, metrics, token, notifier, tls, roots,
                              cfg.client_timeout)
    except OSError as exc:  # taken between the check and the bind, or an address not ours
        why = port_refusal(cfg.host, cfg.port, "--port (0: any free port)")
        print(f"hsmon daemon: {why or f'cannot listen on {cfg.host}:{cfg.port}: {exc.strerror}'}",
              file=sys.stderr)
        return 2
    port = server.server_address[1]
    monitor.start()
    if args.port_file:
        atomic_write(args.port_file, lambda fh: fh.write(f"{port}\n".encode()))
    log.info(
        "listening on %s://%s:%d (jobs: %s; control %s; up to %d connections)",
        "https" if tls else "http",
        cfg.host,
        port,
        ", ".join(monitor.job_names()) or "none",
        "on" if token else "off",
        server.max_connections,
    )
    try:
        serve_until_stopped(args, cfg, server, monitor, notifier)
    finally:
        if state_stream is not sys.stderr:
            state_stream.close()
    return 0


def serve_until_stopped(args: argparse.Namespace, cfg: cfgmod.DaemonConfig, server: DaemonServer,
                        monitor: Any, notifier: Any) -> None:
    """Serve until SIGTERM or SIGINT (SIGHUP reloads); then stop the server, the monitor and the webhook."""
    stopping = threading.Event()
    shutdown_asked: list[bool] = []

    def _shutdown(signum: int, _frame: Any) -> None:
        # A second signal handled inside this handler (on the same thread) must not reach Event.set
        # again: its lock is not re-entrant, and the daemon would hang. Appending takes no lock.
        if shutdown_asked:
            return
        shutdown_asked.append(True)
        stopping.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, _shutdown)
    signal.signal(signal.SIGINT, _shutdown)
    from hsmon.daemon.reload import Reloader

    Reloader(lambda: build_config(args), cfg, monitor, stopping, server, notifier).install()
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
        monitor.stop()
        notifier.close()

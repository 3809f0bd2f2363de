"""`hsmon daemon`: watch jobs; serve /metrics, /api/v1/status and /healthz.

Control endpoints (start or stop work) are off unless a token is configured
(``--control-token-file FILE`` or env HSMON_CONTROL_TOKEN); they need ``Authorization: Bearer TOKEN``:
    POST /api/v1/train              JSON body: the fields of hsmon.launch.validate_training_request
    POST /api/v1/jobs/<job>/stop    SIGTERM to the job's process (a trainer checkpoints, then exits)
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import os
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from hsmon import daemon_security as security
from hsmon import job_flags
from hsmon.contracts.layout import atomic_write
from hsmon.contracts.units import port_number
from hsmon.core import config as cfgmod
from hsmon.core import verify_watch
from hsmon.daemon_http import PooledHandler, PooledHTTPServer
from hsmon.memory_trim import MemoryTrim

log = logging.getLogger("hsmon.daemon")
MAX_BODY = 64 * 1024
MIN_TOKEN = 16


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


def read_control_token(path: str | None) -> str | None:
    """The control token from a file (first line) or env HSMON_CONTROL_TOKEN; None: control is off."""
    token = None
    if path:
        try:
            with open(path) as fh:
                token = fh.readline().strip()
        except OSError as exc:
            raise cfgmod.ConfigError(
                f"--control-token-file {path}: {exc.strerror}; give a readable file"
            ) from None
        if len(token) < MIN_TOKEN:
            raise cfgmod.ConfigError(f"--control-token-file {path}: the token must be at least {MIN_TOKEN} "
                                     "characters")
        security.check_token_file(path)
    elif os.environ.get("HSMON_CONTROL_TOKEN"):
        token = os.environ["HSMON_CONTROL_TOKEN"].strip()
        if len(token) < MIN_TOKEN:
            raise cfgmod.ConfigError(
                f"HSMON_CONTROL_TOKEN: the token must be at least {MIN_TOKEN} characters; give a longer one")
    return token or None


class DaemonServer(PooledHTTPServer):
    """The daemon's endpoints on a fixed pool of handler threads (hsmon/daemon_http.py)."""

    def __init__(
        self, address: tuple[str, int], monitor: Any, metrics: Any, token: str | None, notifier: Any = None,
        tls: ssl.SSLContext | None = None, roots: list[str] | None = None,
        client_timeout: float = cfgmod.DEFAULT_CLIENT_TIMEOUT,
    ) -> None:
        super().__init__(address, Handler, tls, client_timeout, MAX_BODY)
        self.monitor = monitor
        self.metrics = metrics  # hsmon.metrics.exporter.MetricsEndpoint
        self.token = token
        self.notifier = notifier
        self.roots = roots or []
        self.launched: dict[str, int] = {}


class Handler(PooledHandler):
    server: DaemonServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, code: int, obj: Any) -> None:
        self._send(code, (json.dumps(obj, allow_nan=False, default=str) + "\n").encode(), "application/json")

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            from prometheus_client.exposition import CONTENT_TYPE_LATEST

            self._send(200, self.server.metrics.render(), CONTENT_TYPE_LATEST)
        elif path == "/api/v1/status":
            from hsmon.status_doc import encode

            doc = self.server.monitor.status()
            if not self._may_see_cmdlines():
                doc = security.without_cmdlines(doc)
            self._send(200, encode(doc) + b"\n", "application/json")
        elif path == "/healthz":
            self._send(200, b"ok\n", "text/plain; charset=utf-8")
        elif path == "/":
            self._send(200, b"hsmon daemon: /metrics /api/v1/status /healthz\n", "text/plain; charset=utf-8")
        else:
            self._json(404, {"error": f"no such endpoint {path}: use /metrics, /api/v1/status or /healthz"})

    do_HEAD = do_GET

    def _refuse(self, code: int, obj: dict[str, Any]) -> None:
        """Answer a refusal, and log it (who asked what, and why not). Its body, unread, is
        passed over (hsmon/daemon_http.py), never read as the next request."""
        log.warning("refused %s %s from %s: %d %s", self.command, self.path.split("?", 1)[0],
                    self.client_address[0], code, obj.get("error") or obj.get("errors"))
        self._json(code, obj)

    def _token_matches(self) -> bool:
        token, given = self.server.token, self.headers.get("Authorization", "")
        return token is not None and given.startswith("Bearer ") and hmac.compare_digest(
            given[7:].strip().encode(), token.encode())

    def _may_see_cmdlines(self) -> bool:
        """Command lines go to callers on this machine (who can run `ps` anyway) and to callers with
        the control token."""
        return security.is_loopback(self.client_address[0]) or self._token_matches()

    def _authorized(self) -> bool:
        if self.server.token is None:
            self._refuse(403, {"error": "control endpoints are off: start the daemon with "
                                        "--control-token-file"})
            return False
        if not self._token_matches():
            self._refuse(401, {"error": "missing or wrong bearer token (Authorization: Bearer TOKEN)"})
            return False
        return True

    def _body(self) -> dict[str, Any] | None:
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            self._refuse(411, {"error": "chunked bodies are not read: send the JSON with a Content-Length"})
            return None
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY:
            self.close_connection = True  # the body is not read: the connection cannot be reused
            self._refuse(413 if length > 0 else 400,
                         {"error": f"give a Content-Length of at most {MAX_BODY} bytes"})
            return None
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._refuse(400, {"error": "the body is not JSON"})
            return None
        if not isinstance(body, dict):
            self._refuse(400, {"error": "the body must be a JSON object"})
            return None
        return body

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        stop = re.fullmatch(r"/api/v1/jobs/([A-Za-z0-9_.:-]{1,64})/stop", path)
        if path != "/api/v1/train" and not stop:
            self._refuse(404, {"error": f"no such endpoint {path}"})
            return
        if not self._authorized():
            return
        body = self._body()
        if body is None:
            return
        if stop:
            self._stop(stop.group(1))
        else:
            self._train(body)

    def _train(self, body: dict[str, Any]) -> None:
        from hsmon.launch_paths import PathRule
        from hsmon.launch_watch import launch_and_watch

        try:
            # an API caller: no `~`, no relative path; every path resolved, then checked against the
            # roots here and again on what the launch creates (hsmon/launch_paths.py)
            outcome = launch_and_watch(self.server.monitor, body,
                                       PathRule(remote=True, roots=tuple(self.server.roots)))
        except OSError as exc:  # the launch itself failed (systemd-run refused, the disk is full)
            log.error("launch failed: %s", exc)
            self._json(500, {"error": f"the launch failed: {exc}"})
            return
        if outcome.errors:
            self._refuse(400, {"errors": outcome.errors})
        elif outcome.conflict or outcome.job is None:
            self._json(409, {"errors": {"out_dir": outcome.conflict}})
        else:
            job = outcome.job
            log.info("launched training %s: PID %d, events %s", job.job, job.pid, job.events)
            self._json(201, {**job.as_dict(), "warning": outcome.warning})

    def _stop(self, name: str) -> None:
        from hsmon.launch_watch import stop_watched

        pid, error = stop_watched(self.server.monitor, name)
        if pid is None:
            code = 404 if name not in self.server.monitor.job_names() else 409
            self._json(code, {"error": error})
            return
        log.info("sent SIGTERM to job %s (PID %d)", name, pid)
        self._json(202, {"job": name, "pid": pid, "signal": "SIGTERM"})


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        cfg = build_config(args)
        token = read_control_token(cfg.control_token_file)
        roots = security.resolved_roots(cfg.allow_roots)
        security.check_exposure(cfg.host, token, roots)
        tls = security.tls_context(cfg.tls_cert, cfg.tls_key)
    except cfgmod.ConfigError as exc:
        print(f"hsmon daemon: {exc}", file=sys.stderr)
        return 2
    from hsmon.contracts import events as ev
    from hsmon.core.monitor import Monitor
    from hsmon.metrics.exporter import MetricsEndpoint
    from hsmon.notify import NotifierSlot
    from hsmon.scrape_latency import settle_for_serving

    if not cfg.jobs and token is None:
        print(
            "hsmon daemon: nothing to watch: give --dump-dir/--out/--events/--pid/--pidfile/--match, "
            "or --config FILE with [[job]] tables (or a control token to launch trainings)",
            file=sys.stderr,
        )
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
    try:
        server = DaemonServer((cfg.host, cfg.port), monitor, metrics, token, notifier, tls, roots,
                              cfg.client_timeout)
    except OSError as exc:
        print(
            f"hsmon daemon: cannot listen on {cfg.host}:{cfg.port}: {exc.strerror}; pick another --port",
            file=sys.stderr,
        )
        return 2
    port = server.server_address[1]
    monitor.start()
    if args.port_file:
        atomic_write(args.port_file, lambda fh: fh.write(f"{port}\n".encode()))
    log.info(
        "listening on %s://%s:%d (jobs: %s; control %s)",
        "https" if tls else "http",
        cfg.host,
        port,
        ", ".join(monitor.job_names()) or "none",
        "on" if token else "off",
    )
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
    from hsmon.daemon_reload import Reloader

    Reloader(lambda: build_config(args), cfg, monitor, stopping, server, notifier).install()
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
        monitor.stop()
        notifier.close()
        if state_stream is not sys.stderr:
            state_stream.close()
    return 0


class DaemonStartError(RuntimeError):
    """`hsmon daemon` exited, or did not listen in time, when started by :func:`spawn`."""


def spawn(
    options: list[str],
    port_file: str | os.PathLike[str],
    *,
    port: int = 0,
    host: str = "127.0.0.1",
    timeout: float = 30.0,
    **popen: Any,
) -> tuple[subprocess.Popen[bytes], str]:
    """Start `hsmon daemon OPTIONS` as a child process and wait until it listens.

    The daemon binds ``host``:``port`` (0: a free port) and writes the port to ``port_file``.
    Returns the process and its base URL. ``popen`` goes to :class:`subprocess.Popen` (env,
    stdout, stderr). Raises :class:`DaemonStartError` when the daemon exits first or does not
    listen within ``timeout`` seconds (it is then killed).
    """
    port_path = Path(port_file)
    port_path.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "hsmon", "daemon", *options,
            "--host", host, "--port", str(port), "--port-file", str(port_path)]
    proc: subprocess.Popen[bytes] = subprocess.Popen(argv, **popen)
    deadline = time.monotonic() + timeout
    while not port_path.exists():
        if proc.poll() is not None:
            raise DaemonStartError(f"hsmon daemon exited with status {proc.returncode} before listening")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise DaemonStartError(f"hsmon daemon did not listen within {timeout:g} s")
        time.sleep(0.05)
    return proc, f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{int(port_path.read_text())}"

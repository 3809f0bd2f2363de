"""The daemon's HTTP endpoints: /healthz, /metrics, /api/v1/status, and the token-guarded control
(POST /api/v1/train, POST /api/v1/jobs/<job>/stop) on the fixed pool of handler threads."""

from __future__ import annotations

import hmac
import json
import logging
import re
import ssl
from typing import Any

from hsmon.core import config as cfgmod
from hsmon.daemon import security
from hsmon.daemon.http_pool import PooledHandler, PooledHTTPServer
from hsmon.status.client import is_loopback

log = logging.getLogger("hsmon.daemon")

MAX_BODY = 64 * 1024


class DaemonServer(PooledHTTPServer):
    """The daemon's endpoints on a fixed pool of handler threads (hsmon/daemon/http_pool.py)."""

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
        passed over (hsmon/daemon/http_pool.py), never read as the next request."""
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
        return is_loopback(self.client_address[0]) or self._token_matches()

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
        length = self.conn.length if self.conn.length is not None else 0  # parsed once, by the reader
        if length < 0 or length > MAX_BODY:
            self.close_connection = True  # the body is not read: the connection cannot be reused
            self._refuse(413 if length > 0 else 400,
                         {"error": f"give a Content-Length of at most {MAX_BODY} bytes, in digits"})
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
        try:
            self._post()
        except Exception as exc:  # an answer, always: a bug is a 500 in one line, never a dropped connection
            log.exception("error answering POST %s", self.path.split("?", 1)[0])
            self.close_connection = True
            why = f"{type(exc).__name__}: {exc}".splitlines()[0]
            self._json(500, {"error": f"the daemon failed to answer ({why}); see its log"})

    def _post(self) -> None:
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
        from hsmon.launch.paths import PathRule
        from hsmon.launch.watch import launch_and_watch

        try:
            # an API caller: no `~`, no relative path; every path resolved, then checked against the
            # roots here and again on what the launch creates (hsmon/launch/paths.py)
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
        from hsmon.launch.watch import stop_watched

        pid, error = stop_watched(self.server.monitor, name)
        if pid is None:
            code = 404 if name not in self.server.monitor.job_names() else 409
            self._json(code, {"error": error})
            return
        log.info("sent SIGTERM to job %s (PID %d)", name, pid)
        self._json(202, {"job": name, "pid": pid, "signal": "SIGTERM"})

"""A FAKE in front of a REAL SGLang server, for what a healthy real server will not do on demand.

- ``fail_ids``: answer HTTP 500 to every /generate request whose ``input_ids`` equal these (one
  poison row; any other request, a shorter control request included, goes to the real server);
- ``hide_limits``: drop ``max_req_input_len`` and ``context_length`` from /server_info (a server
  that does not publish its limits; for vLLM, ``max_model_len`` from /v1/models), so that the real
  server's own refusal can be met;
- ``untested``: the capture plugin's section of /server_info names this SGLang release, outside
  the tested set (``tested: false``), as a server started on it with ``hsmon sglang-serve
  --allow-untested-sglang`` says; the hidden states stay the real server's;
- ``hold_after``: forward that many /generate requests, then hold the next ones (``held``
  counts them) until ``release()``: a run that cannot end before the test has done its part
  (killed the real server); ``as_dead``: when the real server does not answer, close the
  client's connection unanswered, as the dead server's port would, instead of a 502.

Everything else is forwarded unchanged, status and body included.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HIDDEN = ("max_req_input_len", "context_length")


class FakeSGLangProxy:
    """``start()`` serves on a free local port; ``url`` is what the client is given."""

    def __init__(self, upstream: str, fail_ids: list[int] | None = None, hide_limits: bool = False,
                 port: int = 0, untested: str | None = None, hold_after: int | None = None,
                 as_dead: bool = False) -> None:
        self.upstream = upstream.rstrip("/")
        self.port = port  # 0: any free port
        self.fail_ids = fail_ids
        self.hide_limits = hide_limits
        self.untested = untested
        self.failed = 0  # 500s answered to the poison row
        self.forwarded = 0
        self.hold_after, self.as_dead = hold_after, as_dead
        self.generates = 0  # /generate requests received
        self.held = 0  # of them, held until release()
        self._released = threading.Event()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeSGLangProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _reply(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _forward(self, data: bytes | None) -> tuple[int, bytes]:
                headers = {"Content-Type": "application/json"}
                if self.headers.get("X-Request-Id"):  # vLLM names its request (and its file) by it
                    headers["X-Request-Id"] = self.headers["X-Request-Id"]
                request = urllib.request.Request(proxy.upstream + self.path, data=data, headers=headers)
                try:
                    with urllib.request.urlopen(request, timeout=600) as resp:
                        return resp.status, resp.read()
                except urllib.error.HTTPError as exc:
                    return exc.code, exc.read()
                except OSError as exc:
                    if proxy.as_dead:
                        raise ConnectionAbortedError from exc
                    return 502, json.dumps({"error": {"message": f"fake proxy: {exc}"}}).encode()

            def handle_one_request(self) -> None:
                try:
                    super().handle_one_request()
                except ConnectionAbortedError:  # as_dead: no answer, the connection closed
                    self.close_connection = True

            def do_GET(self) -> None:
                status, body = self._forward(None)
                if status == 200 and self.path in ("/server_info", "/get_server_info"):
                    body = proxy.server_info(body)
                if status == 200 and self.path == "/v1/models" and proxy.hide_limits:
                    models = json.loads(body)
                    for entry in models.get("data", []):
                        entry.pop("max_model_len", None)
                    body = json.dumps(models).encode()
                self._reply(status, body)

            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                poison = proxy.fail_ids is not None and self.path == "/generate"
                if poison and json.loads(data).get("input_ids") == proxy.fail_ids:
                    with proxy._lock:
                        proxy.failed += 1
                    self._reply(500, b'{"error": {"message": "fake proxy: internal error for this row"}}')
                    return
                if self.path == "/generate":
                    proxy.hold_or_pass()
                status, body = self._forward(data)
                with proxy._lock:
                    proxy.forwarded += 1
                self._reply(status, body)

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="fake-sglang-proxy", daemon=True).start()
        return self

    def hold_or_pass(self) -> None:
        with self._lock:
            self.generates += 1
            hold = self.hold_after is not None and self.generates > self.hold_after
            if hold:
                self.held += 1
        if hold:
            self._released.wait(600)

    def release(self) -> None:
        """Let the held /generate requests go on (to the real server, whatever its state)."""
        self._released.set()

    def server_info(self, body: bytes) -> bytes:
        if not (self.hide_limits or self.untested):
            return body
        info = json.loads(body)
        if self.hide_limits:
            for key in HIDDEN:
                info.pop(key, None)
        if self.untested and isinstance(info.get("hsmon_plugin"), dict):
            info["hsmon_plugin"] = {**info["hsmon_plugin"], "sglang_version": self.untested, "tested": False}
        return json.dumps(info).encode()

    def stop(self) -> None:
        self.release()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

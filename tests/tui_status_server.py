"""A real HTTP server on 127.0.0.1 that speaks the daemon's documented API (docs/status-api.md).

It serves fixed status documents and records the launch and stop requests it receives, with
the token check of the control API. For pilot tests of the TUI's controls; the end-to-end test runs
against the real `hsmon daemon`.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tui_complete import complete


class StatusServer:
    def __init__(self, documents: list[dict[str, Any]], token: str = "s3cret", port: int = 0) -> None:
        self.documents = [complete(document) for document in documents]  # as a daemon sends them
        self.token = token
        self.requests: list[tuple[str, dict[str, Any], str | None]] = []
        self.launch_reply: tuple[int, dict[str, Any]] = (201, {"job": "train-1", "pid": 999})
        self.gets = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/api/v1/status":
                    server.gets += 1
                    index = min(server.gets - 1, len(server.documents) - 1)
                    self._reply(200, server.documents[index])
                else:
                    self._reply(404, {"error": "not found"})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                auth = self.headers.get("Authorization")
                server.requests.append((self.path, body, auth))
                if auth != f"Bearer {server.token}":
                    self._reply(401, {"error": "bad or missing token"})
                elif self.path == "/api/v1/train":
                    self._reply(*server.launch_reply)
                elif self.path.startswith("/api/v1/jobs/") and self.path.endswith("/stop"):
                    self._reply(200, {"job": self.path.split("/")[4], "message": "stopping"})
                else:
                    self._reply(404, {"error": "not found"})

        self._httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

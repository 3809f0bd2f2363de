"""The daemon's HTTP server: a fixed pool of handler threads that idle or slow clients cannot hold.

    server = PooledHTTPServer(address, Handler, tls=ctx, client_timeout=60.0, max_body=65536)
    server.serve_forever()          # accepts; one selector reads every request; a pool answers

A connection costs no thread while it is idle or while its request trickles in: one *reader*
thread (a selector over every open connection) does the TLS handshake and reads each request,
head and body (up to ``max_body`` bytes), without blocking; only a complete request goes to one
of ``workers`` threads, which answers it and hands the connection back (keep-alive). An idle
connection is closed after ``client_timeout`` seconds; a request (or a TLS handshake) must be
complete within ``request_timeout`` = min(10 s, client_timeout) of its first byte; past
``max_connections`` open connections the longest idle ones are closed. Handlers subclass
:class:`PooledHandler` and read the request from ``rfile`` as usual.
"""

from __future__ import annotations

import collections
import contextlib
import io
import logging
import queue
import re
import selectors
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

log = logging.getLogger("hsmon.daemon")
WORKERS = 16
MAX_CONNECTIONS = 1000
REQUEST_TIMEOUT_MAX = 10.0
HEAD_MAX = 64 * 1024
_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)[ \t]*\r\n", re.IGNORECASE)
_CHUNKED = re.compile(rb"\r\ntransfer-encoding:", re.IGNORECASE)


class Connection:
    """One client: its socket, the bytes it sent that no handler has read yet, its clocks."""

    def __init__(self, sock: socket.socket, address: Any, handshake: bool) -> None:
        self.sock, self.address, self.handshake = sock, address, handshake
        self.buf = bytearray()
        self.idle_since = time.monotonic()
        self.started: float | None = self.idle_since if handshake else None  # a request's first byte
        self.eof = False

    def complete(self, max_body: int) -> bool:
        """True when ``buf`` holds a whole request (or as much as a handler needs to refuse it)."""
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return len(self.buf) > HEAD_MAX or (self.eof and bool(self.buf))
        head = bytes(self.buf[: end + 2]).lstrip(b"\r\n")
        if _CHUNKED.search(head):
            return True  # refused (411) from the head alone
        match = _LENGTH.search(head)
        length = int(match.group(1)) if match else 0
        return length > max_body or len(self.buf) >= end + 4 + length or self.eof


class PooledHandler(BaseHTTPRequestHandler):
    """Answers one complete request read by the server; ``rfile`` holds it (and what followed)."""

    server: PooledHTTPServer
    protocol_version = "HTTP/1.1"
    body_start: int | None = None

    def __init__(self, conn: Connection, server: PooledHTTPServer) -> None:
        self.conn = conn
        super().__init__(conn.sock, conn.address, server)  # type: ignore[arg-type]

    def setup(self) -> None:
        self.connection = self.request
        self.connection.settimeout(self.server.request_timeout)  # the answer's writes
        self.rfile = io.BytesIO(bytes(self.conn.buf))  # type: ignore[assignment]
        self.wfile = self.connection.makefile("wb", buffering=0)

    def parse_request(self) -> bool:
        ok = super().parse_request()
        self.body_start = self.rfile.tell()
        return ok

    def handle(self) -> None:
        self.close_connection, self.body_start = True, None
        self.handle_one_request()
        self._skip_body()
        del self.conn.buf[: self.rfile.tell()]  # what followed: a pipelined request, kept

    def _skip_body(self) -> None:
        """Pass over what the handler left of the request's body (a refused request's), so that
        it is never read as the next request; a body not all here ends the connection."""
        headers = getattr(self, "headers", None)
        if self.close_connection or self.body_start is None or headers is None:
            return
        try:
            length = int(headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        end = self.body_start + length
        if headers.get("Transfer-Encoding") or length < 0 or end > len(self.conn.buf):
            self.close_connection = True
        elif self.rfile.tell() < end:
            self.rfile.seek(end)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            self.wfile.flush()
        self.wfile.close()


class PooledHTTPServer(HTTPServer):
    request_queue_size = 256  # 50+ scrapers connecting at once must not be refused
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type[PooledHandler], tls: ssl.SSLContext | None,
                 client_timeout: float = 60.0, max_body: int = 64 * 1024, workers: int = WORKERS,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        super().__init__(address, handler)
        self.tls, self.max_body, self.max_connections = tls, max_body, max_connections
        self.client_timeout = client_timeout
        self.request_timeout = min(REQUEST_TIMEOUT_MAX, client_timeout)
        self._ready: queue.SimpleQueue[Connection | None] = queue.SimpleQueue()
        self._incoming: collections.deque[Connection] = collections.deque()
        self._open: dict[socket.socket, Connection] = {}
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)  # a full pipe of wake-ups already wakes the reader
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._closing, self._swept = False, 0.0
        self._threads = [threading.Thread(target=self._read_loop, name="hsmon-http-read", daemon=True)]
        self._threads += [threading.Thread(target=self._work_loop, name=f"hsmon-http-{i}", daemon=True)
                          for i in range(workers)]
        for thread in self._threads:
            thread.start()

    def set_client_timeout(self, seconds: float) -> None:
        """New timeouts (a reload), for the next sweep and the next requests."""
        self.client_timeout = seconds
        self.request_timeout = min(REQUEST_TIMEOUT_MAX, seconds)

    # accepting (serve_forever's thread)
    def process_request(self, request: Any, client_address: Any) -> None:
        # an answer's head and body go in two writes: without this, Nagle's algorithm holds the body
        # until the client's delayed ACK (40 ms per request on a kept-alive connection)
        with contextlib.suppress(OSError):
            request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls is not None:
            try:
                request = self.tls.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
            except (OSError, ssl.SSLError):
                self.shutdown_request(request)
                return
        self._hand_back(Connection(request, client_address, self.tls is not None))

    def _hand_back(self, conn: Connection) -> None:
        conn.idle_since = time.monotonic()
        self._incoming.append(conn)
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    # the reader: every open connection, no thread each
    def _read_loop(self) -> None:
        while not self._closing:
            for key, _ in self._selector.select(timeout=1.0):
                if key.fileobj is self._wake_r:
                    with contextlib.suppress(OSError):
                        while self._wake_r.recv(4096):
                            pass
                else:
                    self._readable(key.data)
            while self._incoming:
                conn = self._incoming.popleft()
                if conn.buf and conn.complete(self.max_body):  # a pipelined request already here
                    self._ready.put(conn)
                    continue
                self._open[conn.sock] = conn
                self._selector.register(conn.sock, selectors.EVENT_READ, conn)
            self._sweep()

    def _readable(self, conn: Connection) -> None:
        conn.sock.settimeout(0.0)
        try:
            if conn.handshake:
                conn.sock.do_handshake()  # type: ignore[attr-defined]
                conn.handshake, conn.started = False, None
            while len(conn.buf) <= HEAD_MAX + self.max_body:
                data = conn.sock.recv(65536)
                if not data:
                    conn.eof = True
                    break
                if not conn.buf:
                    conn.started = time.monotonic()
                conn.buf += data
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            pass
        except (OSError, ssl.SSLError) as exc:
            if conn.handshake:
                log.warning("refused %s: TLS handshake failed (%s)", conn.address[0], exc)
            self._close(conn)
            return
        if conn.complete(self.max_body):
            self._selector.unregister(conn.sock)
            del self._open[conn.sock]
            self._ready.put(conn)
        elif conn.eof:
            self._close(conn)

    def _close(self, conn: Connection) -> None:
        if self._open.pop(conn.sock, None) is not None:
            self._selector.unregister(conn.sock)
        self.shutdown_request(conn.sock)

    def _sweep(self) -> None:
        """Close the connections idle past client_timeout, the requests not complete within
        request_timeout, and the longest idle past max_connections (once a second)."""
        now = time.monotonic()
        if len(self._open) <= self.max_connections and now - self._swept < 1.0:
            return
        self._swept = now
        for conn in list(self._open.values()):
            late = conn.started is not None and now - conn.started > self.request_timeout
            if late or now - conn.idle_since > self.client_timeout:
                self._close(conn)
        excess = len(self._open) - self.max_connections
        if excess > 0:
            for conn in sorted(self._open.values(), key=lambda c: c.idle_since)[:excess]:
                self._close(conn)

    # the workers: complete requests only
    def _work_loop(self) -> None:
        while True:
            conn = self._ready.get()
            if conn is None:
                return
            try:
                handler = self.RequestHandlerClass(conn, self)  # type: ignore[call-arg,arg-type]
                keep = not handler.close_connection  # type: ignore[attr-defined]
            except Exception:  # a handler's bug must not take its worker with it
                log.exception("error answering %s", conn.address[0])
                keep = False
            if keep and not self._closing:
                conn.started = time.monotonic() if conn.buf else None
                self._hand_back(conn)
            else:
                self.shutdown_request(conn.sock)

    def server_close(self) -> None:
        self._closing = True
        for _ in self._threads[1:]:
            self._ready.put(None)
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        super().server_close()
        for thread in self._threads:
            thread.join(timeout=2.0)
        for conn in list(self._open.values()):
            self.shutdown_request(conn.sock)
        self._wake_r.close()
        self._wake_w.close()
        self._selector.close()

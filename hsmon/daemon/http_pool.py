"""The daemon's HTTP server: a fixed pool of handler threads that idle, slow or greedy clients cannot
hold, and answers that are written whole.

    server = PooledHTTPServer(address, Handler, tls=ctx, client_timeout=60.0, max_body=65536)
    server.serve_forever()          # accepts; one selector reads requests and writes answers; a pool answers

A connection costs no thread while it is idle, while its request trickles in, or while its answer
trickles out: one *reader* thread (a selector over every open connection) does the TLS handshake,
reads each request, head and body (up to ``max_body`` bytes), without blocking, and writes what an
answer did not send at once as the client takes it; only a complete request goes to one of
``workers`` threads, which builds the answer in memory and hands the connection back (keep-alive).
An answer is written whole, or, when the client takes none of it for ``client_timeout`` seconds,
the connection is closed: the client sees fewer bytes than its Content-Length said, never a short
answer passed off as whole. An idle connection is closed after ``client_timeout`` seconds; a request
(or a TLS handshake) must be complete within ``request_timeout`` = min(10 s, client_timeout) of its
first byte. Open connections are capped below the file-descriptor limit, with a reserve for the
monitor's own files (:func:`connection_cap`): past the cap the longest idle ones are closed, so a
flood of idle clients never leaves the daemon without descriptors nor deaf to a new one.
``Content-Length`` is parsed once, here (digits only, one value), and handlers read
``conn.length``. Handlers subclass :class:`PooledHandler` and read the request from ``rfile``.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import io
import logging
import queue
import re
import resource
import selectors
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

log = logging.getLogger("hsmon.daemon")
WORKERS = 16
RESERVE_MIN = 96  # descriptors kept for the monitor (events, manifests, /proc, inotify, webhooks)
REQUEST_TIMEOUT_MAX = 10.0
HEAD_MAX = 64 * 1024
BAD_LENGTH = -1  # a Content-Length that is not one run of digits (or two that differ): refused
_LENGTHS = re.compile(rb"\r\ncontent-length:([^\r\n]*)", re.IGNORECASE)
_CHUNKED = re.compile(rb"\r\ntransfer-encoding:", re.IGNORECASE)


def connection_cap(limit: int | None = None) -> int:
    """Open connections allowed under a descriptor limit (the soft RLIMIT_NOFILE by default): all
    but a reserve of a quarter of it (at least RESERVE_MIN) for the monitor's own files."""
    if limit is None:
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if limit == resource.RLIM_INFINITY:
            limit = 1 << 20
    return max(8, limit - max(RESERVE_MIN, limit // 4))


def raise_fd_limit() -> int:
    """Raise the soft descriptor limit to the hard one (what a unit's LimitNOFILE= or ulimit -Hn
    allows); the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def request_length(head: bytes) -> int | None:
    """The request's Content-Length: None when absent, BAD_LENGTH when any value is not a run of
    digits or two values differ (``+5``, ``1_0``, `` 5x`` are refused, never read two ways)."""
    values = {v.strip(b" \t") for v in _LENGTHS.findall(head)}
    if not values:
        return None
    if len(values) > 1 or not all(v.isdigit() and v.isascii() for v in values):
        return BAD_LENGTH
    return int(values.pop())


class Connection:
    """One client: its socket, the bytes it sent that no handler has read yet, the answer not yet
    written, its clocks."""

    def __init__(self, sock: socket.socket, address: Any, handshake: bool) -> None:
        self.sock, self.address, self.handshake = sock, address, handshake
        self.buf = bytearray()
        self.idle_since = time.monotonic()
        self.started: float | None = self.idle_since if handshake else None  # a request's first byte
        self.eof = False
        self.length: int | None = None  # the Content-Length of the request in ``buf``
        self.out = memoryview(b"")  # what is left of the answer to write
        self.close_after = False  # close once ``out`` is written

    def complete(self, max_body: int) -> bool:
        """True when ``buf`` holds a whole request (or as much as a handler needs to refuse it)."""
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return len(self.buf) > HEAD_MAX or (self.eof and bool(self.buf))
        head = bytes(self.buf[: end + 2]).lstrip(b"\r\n")
        if _CHUNKED.search(head):
            return True  # refused (411) from the head alone
        self.length = request_length(head)
        length = self.length or 0
        return length < 0 or length > max_body or len(self.buf) >= end + 4 + length or self.eof

    def send_some(self) -> bool:
        """Write what the socket takes now; True when the whole answer is written."""
        try:
            while self.out:
                sent = self.sock.send(self.out)
                self.out = self.out[sent:]
                self.idle_since = time.monotonic()  # the client takes it: not idle
        except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
            return False
        return True


class PooledHandler(BaseHTTPRequestHandler):
    """Answers one complete request read by the server; ``rfile`` holds it (and what followed), and
    the answer goes to ``wfile`` (memory), which the server writes whole."""

    server: PooledHTTPServer
    protocol_version = "HTTP/1.1"
    body_start: int | None = None

    def __init__(self, conn: Connection, server: PooledHTTPServer) -> None:
        self.conn = conn
        super().__init__(conn.sock, conn.address, server)  # type: ignore[arg-type]

    def setup(self) -> None:
        self.connection = self.request
        self.rfile = io.BytesIO(bytes(self.conn.buf))  # type: ignore[assignment]
        self.wfile = io.BytesIO()  # type: ignore[assignment]

    def parse_request(self) -> bool:
        ok = super().parse_request()
        self.body_start = self.rfile.tell()
        return ok

    def handle(self) -> None:
        self.close_connection, self.body_start = True, None
        self.handle_one_request()
        self._skip_body()
        del self.conn.buf[: self.rfile.tell()]  # what followed: a pipelined request, kept
        self.conn.out = memoryview(self.wfile.getvalue())  # type: ignore[attr-defined]

    def _skip_body(self) -> None:
        """Pass over what the handler left of the request's body (a refused request's), so that
        it is never read as the next request; a body not all here ends the connection."""
        headers = getattr(self, "headers", None)
        if self.close_connection or self.body_start is None or headers is None:
            return
        length = self.conn.length if self.conn.length is not None else 0
        end = self.body_start + length
        if headers.get("Transfer-Encoding") or length < 0 or end > len(self.conn.buf):
            self.close_connection = True
        elif self.rfile.tell() < end:
            self.rfile.seek(end)

    def finish(self) -> None:
        pass  # the server writes ``wfile``'s bytes (PooledHTTPServer._answered)


class PooledHTTPServer(HTTPServer):
    request_queue_size = 256  # 50+ scrapers connecting at once must not be refused
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type[PooledHandler], tls: ssl.SSLContext | None,
                 client_timeout: float = 60.0, max_body: int = 64 * 1024, workers: int = WORKERS,
                 max_connections: int | None = None) -> None:
        super().__init__(address, handler, bind_and_activate=False)
        try:  # bound before any thread starts: a taken port leaves nothing to close but the socket
            self.server_bind()
            self.server_activate()
        except BaseException:
            self.socket.close()
            raise
        self.tls, self.max_body = tls, max_body
        self.max_connections = max_connections or connection_cap()
        self.client_timeout = client_timeout
        self.request_timeout = min(REQUEST_TIMEOUT_MAX, client_timeout)
        self._ready: queue.SimpleQueue[Connection | None] = queue.SimpleQueue()
        self._incoming: collections.deque[Connection] = collections.deque()
        self._open: dict[socket.socket, Connection] = {}
        self._live = 0  # accepted and not yet closed, wherever they are (open, queued, in a worker)
        self._live_lock = threading.Lock()
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
    def get_request(self) -> tuple[socket.socket, Any]:
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):  # never spin on a listener it cannot accept from
                log.warning("out of file descriptors accepting a connection: closing idle ones")
                self._wake()
                time.sleep(0.05)
            raise

    def process_request(self, request: Any, client_address: Any) -> None:
        # an answer's head and body go in two writes: without this, Nagle's algorithm holds the body
        # until the client's delayed ACK (40 ms per request on a kept-alive connection)
        with contextlib.suppress(OSError):
            request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        request.setblocking(False)
        if self.tls is not None:
            try:
                request = self.tls.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
            except (OSError, ssl.SSLError):
                self.shutdown_request(request)
                return
        with self._live_lock:
            self._live += 1
        self._hand_back(Connection(request, client_address, self.tls is not None))

    def _hand_back(self, conn: Connection) -> None:
        conn.idle_since = time.monotonic()
        self._incoming.append(conn)
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _drop(self, conn: Connection) -> None:
        """Close a connection (the one way one ends)."""
        if self._open.pop(conn.sock, None) is not None:
            self._selector.unregister(conn.sock)
        self.shutdown_request(conn.sock)
        with self._live_lock:
            self._live -= 1

    # the reader: every open connection, no thread each
    def _read_loop(self) -> None:
        while not self._closing:
            for key, events in self._selector.select(timeout=1.0):
                if key.fileobj is self._wake_r:
                    with contextlib.suppress(OSError):
                        while self._wake_r.recv(4096):
                            pass
                elif events & selectors.EVENT_WRITE:
                    self._writable(key.data)
                else:
                    self._readable(key.data)
            while self._incoming:
                self._watch(self._incoming.popleft())
            self._sweep()

    def _watch(self, conn: Connection) -> None:
        """Watch a connection for what it waits for: its answer's rest to write, or a request."""
        if conn.out:
            self._open[conn.sock] = conn
            self._selector.register(conn.sock, selectors.EVENT_WRITE, conn)
        elif conn.buf and conn.complete(self.max_body):  # a pipelined request already here
            self._ready.put(conn)
        else:
            self._open[conn.sock] = conn
            self._selector.register(conn.sock, selectors.EVENT_READ, conn)

    def _writable(self, conn: Connection) -> None:
        try:
            done = conn.send_some()
        except (OSError, ssl.SSLError):
            self._drop(conn)
            return
        if not done:
            return
        del self._open[conn.sock]
        self._selector.unregister(conn.sock)
        self._after_answer(conn)

    def _after_answer(self, conn: Connection) -> None:
        """The answer is written: close, or wait for the next request (keep-alive)."""
        if conn.close_after or self._closing:
            with self._live_lock:
                self._live -= 1
            self.shutdown_request(conn.sock)
        else:
            conn.started = time.monotonic() if conn.buf else None
            self._hand_back(conn)

    def _readable(self, conn: Connection) -> None:
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
            self._drop(conn)
            return
        if conn.complete(self.max_body):
            self._selector.unregister(conn.sock)
            del self._open[conn.sock]
            self._ready.put(conn)
        elif conn.eof:
            self._drop(conn)

    def _sweep(self) -> None:
        """Close the connections idle past client_timeout (an answer the client took nothing of for
        that long included), the requests not complete within request_timeout, and, past
        max_connections, the longest idle (once a second, or at once when over the cap)."""
        now = time.monotonic()
        with self._live_lock:
            excess = self._live - self.max_connections
        if excess <= 0 and now - self._swept < 1.0:
            return
        self._swept = now
        for conn in list(self._open.values()):
            late = conn.started is not None and now - conn.started > self.request_timeout
            if late or now - conn.idle_since > self.client_timeout:
                self._drop(conn)
        with self._live_lock:
            excess = self._live - self.max_connections
        if excess > 0:  # waiting for a request first, the longest idle first; answers being written last
            order = sorted(self._open.values(), key=lambda c: (bool(c.out or c.buf), c.idle_since))
            for conn in order[:excess]:
                self._drop(conn)

    # the workers: complete requests only
    def _work_loop(self) -> None:
        while True:
            conn = self._ready.get()
            if conn is None:
                return
            try:
                handler = self.RequestHandlerClass(conn, self)  # type: ignore[call-arg,arg-type]
                conn.close_after = bool(handler.close_connection)  # type: ignore[attr-defined]
            except Exception:  # a handler's bug must not take its worker with it
                log.exception("error answering %s", conn.address[0])
                conn.out, conn.close_after = memoryview(b""), True
            self._answered(conn)

    def _answered(self, conn: Connection) -> None:
        """Write what the socket takes at once (most answers); the rest is the reader's to write."""
        try:
            done = conn.send_some()
        except (OSError, ssl.SSLError):
            conn.out, conn.close_after, done = memoryview(b""), True, True
        if done:
            self._after_answer(conn)
        else:
            self._hand_back(conn)

    def server_close(self) -> None:
        self._closing = True
        for _ in self._threads[1:]:
            self._ready.put(None)
        self._wake()
        super().server_close()
        for thread in self._threads:
            thread.join(timeout=2.0)
        for conn in list(self._open.values()):
            self.shutdown_request(conn.sock)
        self._wake_r.close()
        self._wake_w.close()
        self._selector.close()

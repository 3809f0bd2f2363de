"""The one client of a daemon's ``/api/v1/status``: `hsmon status --url` reads it once, the
dashboard once a second (``StatusClient``).

``KeptGet``, its fast path: one GET over a kept-alive socket. http.client spends most of its CPU
parsing the answer's headers with the email package (0.46 ms of CPU per read of a 5.7 KB document,
measured; a waiting dashboard's largest cost). The daemon answers ``HTTP/1.1 200`` with a
``Content-Length``; this reads exactly that and nothing else.
Anything else (another status, chunked, no length, https) returns None: ``StatusClient`` then
reads with http.client, which reports the error properly.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
from typing import Any
from urllib.parse import urlsplit

STATUS_PATH = "/api/v1/status"


class KeptGet:
    """GET one path of ``host:port`` again and again over one connection."""

    def __init__(self, host: str, port: int, path: str, timeout: float,
                 authorization: str | None = None) -> None:
        self.address = (host, port)
        self.timeout = timeout
        auth = f"Authorization: {authorization}\r\n" if authorization else ""
        self.request = (f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                        f"Accept: application/json\r\n{auth}\r\n").encode("ascii")
        self._sock: socket.socket | None = None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def get(self) -> bytes | None:
        """The body of a 200 answer; None for any other answer; OSError when the daemon cannot be
        reached (a connection the daemon closed meanwhile is opened again once)."""
        for attempt in (1, 2):
            fresh = self._sock is None
            try:
                return self._exchange()
            except (OSError, ValueError):
                self.close()
                if fresh or attempt == 2:
                    raise
        return None  # unreachable

    def _exchange(self) -> bytes | None:
        if self._sock is None:
            self._sock = socket.create_connection(self.address, timeout=self.timeout)
        sock = self._sock
        sock.sendall(self.request)
        data = b""
        while (end := data.find(b"\r\n\r\n")) < 0:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionResetError("the daemon closed the connection")
            data += chunk
        head, body = data[:end].split(b"\r\n"), data[end + 4:]
        fields = dict(line.split(b":", 1) for line in head[1:] if b":" in line)
        headers = {k.strip().lower(): v.strip().lower() for k, v in fields.items()}
        length = headers.get(b"content-length")
        if head[0].split(b" ", 2)[1:2] != [b"200"] or length is None or b"transfer-encoding" in headers:
            self.close()
            return None
        size = int(length)
        buffer = bytearray(body)
        while len(buffer) < size:
            chunk = sock.recv(size - len(buffer))
            if not chunk:
                raise ConnectionResetError("the daemon closed the connection")
            buffer += chunk
        if headers.get(b"connection") == b"close":
            self.close()
        return bytes(buffer[:size])


def check_url(url: str) -> str:
    """The URL of a daemon as given, or ValueError in one line when it lacks its scheme."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--url {url}: give a full URL such as http://{url.lstrip('/') or '127.0.0.1:9108'}")
    return url


def check_token_transport(url: str, token: str | None, insecure: bool = False) -> None:
    """ValueError in one line when a bearer token would go in clear text (http://) to another machine,
    unless the operator said so (--insecure-plain-http)."""
    parts = urlsplit(url)
    if not token or insecure or parts.scheme != "http" or is_loopback(parts.hostname or ""):
        return
    raise ValueError(f"--url {url}: the control token would cross the network in clear text over http://; "
                     "serve the daemon over TLS (--tls-cert/--tls-key) and give https:// (--ca FILE), or "
                     "--insecure-plain-http if the network between you is yours alone")


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses (``[::1]`` too)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def base_url_of(url: str) -> str:
    """The daemon's base URL from what a user gives (``/api/v1/status`` and a trailing / dropped)."""
    base = url.rstrip("/")
    return base[: -len(STATUS_PATH)] if base.endswith(STATUS_PATH) else base


class StatusClient:
    """GET one daemon's status document, again and again, over one kept-alive connection."""

    def __init__(self, url: str, timeout: float = 3.0, ca: str | None = None,
                 token: str | None = None) -> None:
        self.base_url = base_url_of(url)
        self.url = self.base_url + STATUS_PATH
        self.timeout = timeout
        self.ca = ca  # PEM file of the CA (or self-signed certificate) an https daemon is checked against
        # with the control token the daemon shows command lines to a caller on another machine too
        self.headers = {"Accept": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self._conn: Any = None
        self._kept: KeptGet | None = None

    def close(self) -> None:
        if self._kept is not None:
            self._kept.close()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def get(self) -> bytes:
        """The document's bytes. Raises OSError or http.client.HTTPException when the daemon cannot
        be read, ValueError when it answers an error status (a kept connection the daemon closed
        meanwhile is opened again once)."""
        url = urlsplit(self.base_url)
        if url.scheme == "http" and url.hostname:
            if self._kept is None:
                self._kept = KeptGet(url.hostname, url.port or 80, f"{url.path}{STATUS_PATH}", self.timeout,
                                     self.headers.get("Authorization"))
            try:
                body = self._kept.get()
            except (OSError, ValueError):
                body = None  # http.client says what is wrong, in its words
            if body is not None:
                return body
        for attempt in (1, 2):
            if self._conn is None:
                if url.scheme == "https":
                    context = ssl.create_default_context(cafile=self.ca)
                    self._conn = http.client.HTTPSConnection(url.netloc, timeout=self.timeout,
                                                             context=context)
                else:
                    self._conn = http.client.HTTPConnection(url.netloc, timeout=self.timeout)
            try:
                self._conn.request("GET", f"{url.path}{STATUS_PATH}", headers=self.headers)
                response = self._conn.getresponse()
                body = response.read()
            except (http.client.HTTPException, OSError):
                self._conn.close()
                self._conn = None
                if attempt == 2:
                    raise
                continue
            if response.status >= 400:
                raise ValueError(f"{self.url} answered {response.status} {response.reason}")
            return body
        raise AssertionError("unreachable")

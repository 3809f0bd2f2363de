"""The server tracker's HTTP and its look at a local server's environment (I/O only)."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request

SGLANG_DEFAULT_HEALTH_TIMEOUT = 20.0  # SGLang's SGLANG_HEALTH_CHECK_TIMEOUT when unset


class Unreachable(Exception):
    """The HTTP front did not answer (refused, reset, timed out)."""


def http_get(url: str, timeout: float) -> tuple[int, bytes]:
    """(status, body) of a GET; raises Unreachable when no HTTP answer came back."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, b""
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise Unreachable(str(reason) or type(exc).__name__) from None


def listening_pids(url: str) -> list[int]:
    """The processes that listen on a local URL's port (none for a remote URL); psutil.Error may rise."""
    import psutil

    parts = urllib.parse.urlsplit(url)
    if parts.hostname not in ("127.0.0.1", "localhost", "::1") or parts.port is None:
        return []
    return sorted({c.pid for c in psutil.net_connections(kind="tcp")
                   if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == parts.port and c.pid})


def sglang_timeout_of(url: str) -> tuple[float, str] | None:
    """SGLang's own /health_generate timeout for a server on this machine: SGLANG_HEALTH_CHECK_TIMEOUT
    in the environment of the process that listens on the URL's port (``hsmon sglang-serve`` passes
    its environment on), else SGLang's default. None when not local or not readable."""
    import psutil

    try:
        for pid in listening_pids(url):
            value = psutil.Process(pid).environ().get("SGLANG_HEALTH_CHECK_TIMEOUT")
            if value is None:
                return SGLANG_DEFAULT_HEALTH_TIMEOUT, f"SGLang's default (unset for PID {pid})"
            return float(value), f"SGLANG_HEALTH_CHECK_TIMEOUT in the environment of PID {pid}"
    except (psutil.Error, OSError, ValueError):
        return None
    return None

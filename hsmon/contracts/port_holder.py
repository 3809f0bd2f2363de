"""A port a command is about to serve on, checked before anything starts: free, or one line naming
who holds it.

    refusal = port_refusal("127.0.0.1", 9108, "--port")   # None when free (or port 0)
    # 'port 9108 on 127.0.0.1 is taken by another hsmon daemon (PID 4242, watching jobs extract,
    #  train-x): stop it, or give another --port'

Every command that serves a port (`hsmon daemon`, `sglang-serve`, `vllm-serve`, the demo) says this
line and exits 2 rather than loading a model first and dying in the server's own traceback. The
holder is found through the kernel's socket table (psutil: a process of another user has no PID
for us) and, when it answers hsmon's status API, by its jobs.
"""

from __future__ import annotations

import contextlib
import errno
import json
import socket
import urllib.request
from typing import Any

STATUS_TIMEOUT_S = 2.0
CMDLINE_CHARS = 90


def bind_error(host: str, port: int) -> OSError | None:
    """The error binding ``host``:``port`` gives now (with SO_REUSEADDR, as the servers bind), or None."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        return exc
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            return exc
    return None


def port_refusal(host: str, port: int, flag: str = "--port") -> str | None:
    """None when ``port`` binds on ``host`` now (or is 0: any port); else the one-line refusal: who
    holds the port, or why the address cannot be had, and the fix (``flag``: the command's option)."""
    if port == 0:
        return None
    error = bind_error(host, port)
    if error is None:
        return None
    if error.errno == errno.EADDRINUSE:
        return f"port {port} on {host} is taken by {holder_of(host, port)}: stop it, or give another {flag}"
    why = f"cannot listen on {host}:{port}: {error.strerror or error}"
    if error.errno == errno.EACCES:
        return f"{why} (ports below 1024 need privileges): give another {flag}"
    return f"{why}: give an address of this machine (127.0.0.1 for this machine only, 0.0.0.0 for all)"


def holder_of(host: str, port: int) -> str:
    """Who listens on ``port``: another hsmon daemon and its jobs, a named process, or unknown."""
    pid = _listener_pid(port)
    cmdline = _cmdline(pid) if pid is not None else None
    hsmon_daemon = bool(cmdline and "hsmon" in cmdline and " daemon" in cmdline)
    jobs = _hsmon_jobs(host, port) if hsmon_daemon or cmdline is None else None
    if jobs is not None or hsmon_daemon:
        said = [f"PID {pid}"] if pid is not None else []
        if jobs is None:
            said.append("not answering its status API")
        else:
            said.append(f"watching jobs {', '.join(jobs)}" if jobs else "watching no job")
        return f"another hsmon daemon ({', '.join(said)})"
    if pid is None:
        return f"a process this user cannot see (as root, `ss -ltnp 'sport = :{port}'` names it)"
    cmdline = " ".join(cmdline.split()) if cmdline else None  # one line, whatever the arguments held
    if cmdline and len(cmdline) > CMDLINE_CHARS:
        cmdline = cmdline[: CMDLINE_CHARS - 3] + "..."
    return f"PID {pid} ({cmdline or 'its command line unreadable'})"


def _listener_pid(port: int) -> int | None:
    import psutil

    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    for conn in connections:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            return int(conn.pid)
    return None


def _cmdline(pid: int) -> str | None:
    import psutil

    try:
        return " ".join(psutil.Process(pid).cmdline()) or None
    except (psutil.Error, OSError):
        return None


def _hsmon_jobs(host: str, port: int) -> list[str] | None:
    """The job names of an hsmon daemon answering on ``port`` (plain HTTP), or None when none does."""
    target = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
    target = f"[{target}]" if ":" in target else target
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # a local port: no proxy
    try:
        with opener.open(f"http://{target}:{port}/api/v1/status", timeout=STATUS_TIMEOUT_S) as resp:
            body: Any = json.loads(resp.read(4 * 1024 * 1024))
    except (OSError, ValueError):
        return None
    with contextlib.suppress(AttributeError, TypeError, KeyError):
        return [str(job["job"]) for job in body["jobs"]]
    return None

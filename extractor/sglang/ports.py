"""A free TCP port that no other process's port-0 bind or outgoing connection can take.

SGLang picks its torch.distributed port (``--nccl-port``) by binding port 0, closing the socket,
and binding the number again in its scheduler seconds later, after the model has loaded
(``get_free_port`` in sglang/srt/utils/network.py, called by ``PortArgs.init_new``). The kernel
hands port-0 binds and outgoing connections numbers from its ephemeral range, so in that window
any of them (gloo's listeners in another SGLang starting beside it, a client's connection) can
take the number, and the scheduler dies with EADDRINUSE. A port outside the ephemeral range is
only ever taken by someone naming it.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL = (32768, 60999)  # Linux's default
LOWEST = 10000  # below: the well-known and registered services people run


def ephemeral_range(source: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default where it cannot be read)."""
    try:
        low, high = (int(part) for part in source.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return low, high


def stable_ports(low: int, high: int) -> list[int]:
    """The candidates: from LOWEST up to 65535, less the ephemeral range [low, high]."""
    return [p for p in range(LOWEST, 65536) if not low <= p <= high]


def free_stable_port(host: str = "127.0.0.1", attempts: int = 200) -> int:
    """A port outside the ephemeral range that binds on ``host`` now (no SO_REUSEADDR: a port
    with a connection still in TIME_WAIT is passed over)."""
    candidates = stable_ports(*ephemeral_range())
    picker = random.SystemRandom()
    for _ in range(attempts):
        port = picker.choice(candidates)
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    raise OSError(f"no free TCP port on {host} outside the ephemeral range after {attempts} tries")

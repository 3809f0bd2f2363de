"""SGLang's torch.distributed port, chosen by sglang-serve outside the kernel's ephemeral range.

SGLang's own choice (bind port 0, close, bind again after the model loads) lost its port to a
second server starting beside it in CI (EADDRINUSE in the scheduler, 0.5.18): a port outside the
range is never handed out by a port-0 bind. The real servers of tests/test_sglang_server.py run
with the port chosen here (its server-info test checks it).
"""

from __future__ import annotations

import socket

import pytest

from extractor.sglang import ports, serve


def test_the_ephemeral_range_is_read_from_the_kernel_or_linux_default(tmp_path):
    source = tmp_path / "ip_local_port_range"
    source.write_text("40000\t50000\n")
    assert ports.ephemeral_range(source) == (40000, 50000)
    source.write_text("garbage\n")
    assert ports.ephemeral_range(source) == ports.DEFAULT_EPHEMERAL
    assert ports.ephemeral_range(tmp_path / "absent") == ports.DEFAULT_EPHEMERAL


def test_candidates_leave_out_the_ephemeral_range_and_the_registered_ports():
    candidates = ports.stable_ports(32768, 60999)
    assert candidates[0] == ports.LOWEST and candidates[-1] == 65535
    assert 32767 in candidates and 61000 in candidates
    assert not any(32768 <= p <= 60999 for p in candidates)


def test_a_free_stable_port_binds_and_lies_outside_this_machine_s_range():
    low, high = ports.ephemeral_range()
    for _ in range(20):
        port = ports.free_stable_port()
        assert not low <= port <= high and port >= ports.LOWEST
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free when returned


def test_a_port_in_use_is_passed_over(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        monkeypatch.setattr(ports, "stable_ports", lambda low, high: [port])  # the only candidate
        with pytest.raises(OSError, match=r"no free TCP port on 127\.0\.0\.1 outside the ephemeral range"):
            ports.free_stable_port(attempts=5)
    assert ports.free_stable_port() == port


def test_sglang_serve_passes_the_port_unless_the_user_gave_one():
    cmd = serve.build_command("python", "/m", [2, 4, 5], "127.0.0.1", 30000, True, [], nccl_port=23456)
    assert cmd[cmd.index("--nccl-port") + 1] == "23456"
    mine = serve.build_command("python", "/m", [2, 4, 5], "127.0.0.1", 30000, True, ["--nccl-port", "20001"],
                               nccl_port=23456)
    assert mine.count("--nccl-port") == 1 and mine[mine.index("--nccl-port") + 1] == "20001"


def test_sglang_serve_passes_enable_metrics_once_unless_told_not_to():
    """The daemon's load figures (running, queued, tokens/s) come from SGLang's /metrics."""
    assert serve.build_command("python", "/m", [2, 4, 5], "127.0.0.1", 30000, True, []).count(
        "--enable-metrics") == 1
    given = serve.build_command("python", "/m", [2, 4, 5], "127.0.0.1", 30000, True, ["--enable-metrics"])
    assert given.count("--enable-metrics") == 1
    assert "--enable-metrics" not in serve.build_command("python", "/m", [2, 4, 5], "127.0.0.1", 30000, True,
                                                         [], metrics=False)

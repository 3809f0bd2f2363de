"""Server tracker arithmetic: the load parser on a real SGLang /metrics capture (and on renamed or
missing series), and the state rule. The threads and HTTP run against a real server in
tests/test_server_sglang.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from hsmon.trackers.server_rules import parse_load, server_state

# SGLang 0.5.23 with --enable-metrics on CPU, captured with curl (tests/fixtures/sglang_recording/README)
CAPTURE = Path(__file__).parent / "fixtures" / "sglang_recording" / "metrics.txt"


def test_load_from_a_real_sglang_capture():
    load = parse_load(CAPTURE.read_text())
    assert load == {
        "running": 0.0,
        "queued": 0.0,
        "token_usage": 0.19,
        "gen_throughput": 0.0,
        "generation_tokens_total": 1908.0,
        "prompt_tokens_total": 3912.0,
    }


def test_tensor_parallel_replicas_count_once_and_data_parallel_groups_add_up():
    text = "\n".join(
        f'sglang:num_running_reqs{{dp_rank="{dp}",tp_rank="{tp}"}} {3 + dp}'
        for dp in (0, 1)
        for tp in range(4)
    ) + '\nsglang:token_usage{tp_rank="0"} 0.5\nsglang:token_usage{tp_rank="1"} 0.7\n'
    assert parse_load(text) == {"running": 7.0, "token_usage": 0.7}


def test_other_engines_names_and_missing_series_are_tolerated():
    vllm = (
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 2\n"
        "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 9\n"
        "# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total 120\n"
    )
    assert parse_load(vllm) == {"running": 2.0, "queued": 9.0, "generation_tokens_total": 120.0}
    assert parse_load("# nothing here\nprocess_cpu_seconds_total 3\n") == {}


def test_text_that_is_not_prometheus_gives_nothing_or_raises_value_error():
    assert parse_load("<html><body>404 not found</body></html>\n") == {}
    with pytest.raises(ValueError):
        parse_load('sglang:num_running_reqs{tp_rank="0" 3\n')


def state(now=100.0, **kw):
    base = dict(
        looked=True, reachable=True, not_sglang=False, front_error=None, health_in_flight_since=None,
        health_ok=True, health_latency_s=1.0, health_error=None, health_timeout=25.0, busy_after=5.0,
    )
    base.update(kw)
    return server_state(now, **base)


def test_state_rule():
    assert state(looked=False)[0] == "unknown"
    assert state(reachable=False, front_error="[Errno 111] Connection refused") == (
        "down", "[Errno 111] Connection refused")
    assert state(not_sglang=True)[0] == "unknown" and "not an SGLang server" in state(not_sglang=True)[1]
    assert state(health_ok=None, health_latency_s=None)[0] == "up"
    assert state() == ("up", "/health_generate answered in 1.0 s")
    assert state(health_latency_s=7.5) == ("busy", "/health_generate took 7.5 s")
    assert state(health_in_flight_since=94.0)[0] == "busy"  # 6 s pending, under the timeout
    assert state(health_in_flight_since=74.0)[0] == "hung"  # 26 s pending, over the 25 s timeout
    assert state(health_ok=False, health_error="HTTP 503") == (
        "hung", "the HTTP front answers but /health_generate failed (HTTP 503)")


def test_servers_from_flags_and_toml_and_bad_input_named(tmp_path):
    import argparse

    from hsmon.config import ConfigError, add_job_arguments, job_from_args, load_toml

    parser = argparse.ArgumentParser()
    add_job_arguments(parser)
    job = job_from_args(parser.parse_args(
        ["--server", "http://127.0.0.1:30000/", "--server", "http://h:1", "--health-interval", "3",
         "--busy-after", "2.5"]))  # fmt: skip
    got = [(s.url, s.health_interval, s.busy_after) for s in job.servers]
    assert got == [("http://127.0.0.1:30000", 3.0, 2.5), ("http://h:1", 3.0, 2.5)]
    assert job.server_spec("http://from-start-event:1").busy_after == 2.5  # servers the start event names
    with pytest.raises(ConfigError, match="busy_after must be a positive number of seconds"):
        job_from_args(parser.parse_args(["--server", "http://h:1", "--busy-after", "0"]))
    with pytest.raises(ConfigError, match="server URL 'localhost:30000' is not valid: give http://HOST:PORT"):
        job_from_args(parser.parse_args(["--server", "localhost:30000"]))
    toml = tmp_path / "h.toml"
    toml.write_text(
        '[[job]]\nname = "x"\nout_dir = "/tmp"\n[[job.server]]\nurl = "http://a:1"\nhealth_timeout = 9\n'
    )
    (server,) = load_toml(str(toml)).jobs[0].servers
    got = (server.url, server.health_timeout, server.interval, server.busy_after)
    assert got == ("http://a:1", 9.0, 5.0, 5.0)
    toml.write_text('[[job]]\nname = "x"\nbusy_after = 2\n[[job.server]]\nurl = "http://a:1"\n')
    assert load_toml(str(toml)).jobs[0].servers[0].busy_after == 2.0  # a job-level default
    toml.write_text('[[job]]\nname = "x"\n[[job.server]]\nurl = "http://a:1"\nhealthz = 9\n')
    with pytest.raises(ConfigError, match=r"\[\[job.server\]\] needs url and takes only"):
        load_toml(str(toml))

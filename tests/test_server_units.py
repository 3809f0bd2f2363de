"""Server tracker arithmetic: the load parser on a real SGLang /metrics capture (and on renamed or
missing series), and the state rule, alone and over recorded sequences fed to the tracker's
bookkeeping. The threads and HTTP run against a real server in
tests/test_server_sglang.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from hsmon.core.config import ServerSpec
from hsmon.core.state_server import ServerLook, decide_server
from hsmon.core.trackers.server import ServerTracker
from hsmon.core.trackers.server_rules import parse_load

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
        "scheduler_tokens_total": 7455.0,
        "decode_tokens_total": 1979.0,  # realtime_tokens_total{mode="decode"}: decode steps alone
        "requests_total": 21.0,
        # SGLang exports its speculative gauges at 0 on a server that does not draft
        "spec_accept_length": 0.0,
        "spec_accept_rate": 0.0,
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
        now=now, looked=True, reachable=True, health_ok=True, health_latency_s=1.0, last_ok_ts=now - 1,
        health_timeout=25.0, busy_after=5.0,
    )
    base.update(kw)
    return decide_server(ServerLook(**base))


def test_state_rule():
    assert state(looked=False)[0] == "unknown"
    assert state(reachable=False, front_error="[Errno 111] Connection refused") == (
        "down", "[Errno 111] Connection refused")
    unknown = state(not_sglang=True)
    assert unknown[0] == "unknown" and "not an SGLang or vLLM server" in unknown[1]
    assert state(health_ok=None, health_latency_s=None)[0] == "up"
    assert state() == ("up", "/health_generate answered in 1.0 s")
    assert state(health_latency_s=7.5) == ("busy", "/health_generate took 7.5 s")
    pending = dict(health_in_flight_since=94.0, unanswered_since=94.0, last_ok_ts=93.0)
    assert state(**pending)[0] == "busy"  # 6 s pending, under the timeout
    assert state(**pending, health_timeout=5.0)[0] == "hung"  # --health-timeout means what it says:
    assert state(health_in_flight_since=74.0, unanswered_since=74.0, last_ok_ts=73.0)[0] == "hung"  # 26 s
    # the check failed once, 3 s ago, and nothing else moved: busy, not (yet) hung
    failed = dict(health_ok=False, health_error="HTTP 503", health_latency_s=20.0, failures_in_row=1,
                  unanswered_since=77.0, last_ok_ts=76.0)  # fmt: skip
    assert state(**failed)[0] == "busy"
    assert state(**failed, now=103.0)[0] == "hung"  # 26 s since the unanswered check went out
    # ... unless the job's rows kept arriving from this server meanwhile
    assert state(**failed, now=103.0, job_progress_ts=101.0)[0] == "busy"
    # a check pending for a moment after a success is not busy
    assert state(health_in_flight_since=99.5, unanswered_since=99.5)[0] == "up"


def test_a_front_that_times_out_is_busy_until_the_timeout_then_down_a_refusal_is_down_at_once():
    slow = dict(front_unanswered_since=96.0, front_timeouts=1, front_error="timed out")
    assert state(**slow) == ("busy", "the HTTP front is slow: no answer for 4 s (timed out ×1); down after "
                                     "25 s without one")  # fmt: skip
    assert state(**slow, now=122.0) == ("down", "the HTTP front has not answered for 26 s (timed out ×1; "
                                                "--health-timeout 25 s)")  # fmt: skip
    assert state(reachable=False, front_error="[Errno 111] Connection refused")[0] == "down"


class Replay:
    """A recorded sequence fed to the real tracker's bookkeeping (no threads, no HTTP): /metrics
    answers and /health_generate outcomes at given times; ``state(t)`` is what the daemon shows."""

    def __init__(self, health_timeout: float = 120.0, busy_after: float = 1.5) -> None:
        spec = ServerSpec("http://10.0.0.5:30000", interval=1.0, health_interval=1.0,
                          health_timeout=health_timeout, busy_after=busy_after)  # fmt: skip
        self.tracker = ServerTracker(spec, now=0.0)

    def metrics(self, t: float, prompt: float, gen: float, queued: float = 0, running: float = 0) -> None:
        body = (
            f'sglang:prompt_tokens_total{{model_name="m"}} {prompt}\n'
            f'sglang:generation_tokens_total{{model_name="m"}} {gen}\n'
            f'sglang:num_requests_total{{model_name="m"}} {gen}\n'
            f'sglang:num_queue_reqs{{tp_rank="0"}} {queued}\n'
            f'sglang:num_running_reqs{{tp_rank="0"}} {running}\n'
        )
        self.tracker.record_metrics(t, body.encode())

    def check(self, start: float, end: float, status: int) -> None:
        self.tracker.health_started(start)
        self.tracker.health_done(end, status == 200, end - start, None if status == 200 else f"HTTP {status}")

    def state(self, t: float) -> tuple[str, str]:
        return self.tracker.facts(t).state, self.tracker.facts(t).detail


def test_replay_a_long_prefill_past_sglangs_own_timeout_reads_busy_never_hung():
    """The issue's failing run: a 22.5 s prefill, SGLang's check gives up at 20 s (503), the next one
    answers once the prefill is done; nothing else moves meanwhile (one request, no decode)."""
    r = Replay(health_timeout=120.0)
    r.metrics(0.0, 100, 10)
    r.check(0.0, 1.0, 200)
    r.tracker.health_started(1.0)
    states = [r.state(t)[0] for t in (2.0, 3.0, 10.0, 20.0)]
    r.tracker.health_done(21.0, False, 20.0, "HTTP 503")
    state, detail = r.state(21.5)
    assert state == "busy", detail
    assert detail.startswith(
        "one forward has run 20 s (/health_generate 503 ×1; SGLang's health check gave up at 20 s; "
        "counters frozen for 20 s); queue 0, running 0; hung after 120 s"
    ), detail
    r.metrics(22.0, 100, 10)
    r.tracker.health_started(22.0)
    states += [r.state(t)[0] for t in (22.5, 23.0)]
    r.metrics(23.0, 4100, 11)  # the prefill's request finished
    assert "prompt tokens moved 0 s ago" in r.state(23.0)[1]
    r.tracker.health_done(23.5, True, 1.5, None)
    states.append(r.state(24.0)[0])
    assert states == ["up", "busy", "busy", "busy", "busy", "busy", "up"], states
    assert r.tracker.snapshot(24.0).health.sglang_timeout_s == 20.0  # measured from the 503


def test_replay_the_same_prefill_with_a_health_timeout_shorter_than_it_reads_hung():
    """--health-timeout 10 means "no forward completed in 10 s": the same 22 s forward is hung from 11 s."""
    r = Replay(health_timeout=10.0)
    r.metrics(0.0, 100, 10)
    r.check(0.0, 1.0, 200)
    r.tracker.health_started(1.0)
    assert r.state(10.5)[0] == "busy"
    state, detail = r.state(11.5)
    assert state == "hung", detail
    assert detail.startswith("no forward completed in 10 s (--health-timeout 10 s); one pending 10 s"), detail


def test_replay_503s_while_the_counters_move_read_busy():
    """Generation tokens move every second while every /health_generate answers 503: busy for as long
    as that lasts, the reason saying what moved."""
    r = Replay(health_timeout=25.0)
    r.metrics(0.0, 100, 10)
    r.check(0.0, 0.5, 200)
    for k in range(4):  # four checks, each given up after 20 s
        start = 1.0 + 21 * k
        r.tracker.health_started(start)
        for t in range(int(start), int(start) + 20):
            r.metrics(float(t), 100 + t, 10 + 5 * t, queued=3, running=1)
            assert r.state(float(t) + 0.5)[0] in ("up", "busy")
        r.tracker.health_done(start + 20, False, 20.0, "HTTP 503")
    state, detail = r.state(85.5)
    assert state == "busy", detail
    assert "/health_generate 503 ×4" in detail and "prompt tokens moved 2 s ago" in detail, detail


def test_replay_503s_while_frozen_read_hung_with_what_was_seen():
    """A SIGSTOPped scheduler: the counters stop, SGLang's check gives up after its 5 s, again and again."""
    r = Replay(health_timeout=12.0, busy_after=5.0)
    r.metrics(0.0, 100, 10, queued=3, running=1)
    r.check(0.0, 0.5, 200)
    r.metrics(1.0, 120, 20, queued=3, running=1)  # the last movement: frozen from here
    seen = []
    for k in range(4):
        start = 2.0 + 7 * k
        r.tracker.health_started(start)
        r.metrics(start + 1, 120, 20, queued=3, running=1)
        seen.append((start + 4, r.state(start + 4)[0]))
        r.tracker.health_done(start + 5, False, 5.0, "HTTP 503")
        seen.append((start + 5.5, r.state(start + 5.5)[0]))
    assert [s for t, s in seen if t <= 14] == ["up", "busy", "busy"], seen
    assert [s for t, s in seen if t > 14] == ["hung"] * 5, seen  # from 2 (first unanswered) + 12
    assert r.state(30.0) == (
        "hung",
        "no forward completed in 29 s (--health-timeout 12 s); /health_generate 503 ×4; "
        "SGLang's health check gave up at 5 s; queue 3, running 1, counters frozen",
    )


def test_replay_success_after_503_is_up_again_and_forgets_the_failures():
    r = Replay(health_timeout=12.0, busy_after=5.0)
    r.metrics(0.0, 100, 10)
    r.check(0.0, 0.5, 200)
    r.check(1.0, 6.0, 503)
    r.check(7.0, 12.0, 503)
    assert r.state(12.5)[0] == "busy"
    r.check(13.0, 13.2, 200)
    assert r.state(13.5) == ("up", "/health_generate answered in 0.2 s")
    assert r.tracker.snapshot(13.5).health.failures_in_row == 0
    r.tracker.health_started(14.0)
    assert r.state(20.0)[0] == "busy" and r.state(26.5)[0] == "hung"  # counted afresh from 14 s


def test_replay_an_immediate_503_on_an_idle_server_reads_hung_after_the_timeout():
    """A 503 for another reason (answered at once, SGLang's timeout known to be 20 s) on a server where
    nothing moves: no sign of progress, so hung once --health-timeout has passed."""
    r = Replay(health_timeout=10.0, busy_after=5.0)
    r.tracker.sglang_timeout, r.tracker._timeout_looked = (20.0, "SGLang's default (unset for PID 7)"), True
    r.metrics(0.0, 100, 10)
    for k in range(6):
        r.check(1.0 + 2 * k, 1.0 + 2 * k + 0.01, 503)
    state, detail = r.state(10.5)
    assert state == "busy" and "answered at once; SGLang's own timeout is 20 s" in detail, detail
    assert r.state(11.5)[0] == "hung"


def test_servers_from_flags_and_toml_and_bad_input_named(tmp_path):
    import argparse

    from hsmon.core.config import ConfigError, load_toml
    from hsmon.job_flags import add_job_arguments, job_from_args

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


def _plugin_snapshot(requests: int, hook_ms: list[float], **counters: float) -> dict:
    """One scheduler's ``hsmon_capture`` dict as the plugin itself builds it (its Stats)."""
    import sys

    from extractor.sglang import serve

    sys.path.insert(0, str(serve.PLUGIN_ROOT))
    try:
        from hsmon_sglang_plugin.writer import Stats
    finally:
        sys.path.pop(0)
    stats = Stats(pool_limit_bytes=1 << 30, requests=requests, **counters)
    stats.hook_samples.extend(("async", ms, 1.0) for ms in hook_ms)
    return stats.snapshot()


def test_capture_counters_sum_over_schedulers_and_are_null_without_the_plugin():
    from hsmon.core.trackers.server_capture import parse_capture

    info = {"hsmon_plugin": {"version": "1"}, "internal_states": [
        {"hsmon_capture": _plugin_snapshot(3, [0.2, 0.3, 40.0], files_written=2, write_errors=1,
                                           queue_depth=1, pool_bytes_in_use=100, write_seconds=0.5)},
        {"hsmon_capture": _plugin_snapshot(2, [0.1, 0.4], files_written=2, sync_fallbacks=1,
                                           hook_seconds=0.25)},
    ]}
    facts = parse_capture(info, now=5.0)
    assert facts is not None
    assert (facts.schedulers, facts.plugin_version, facts.requests, facts.files_written) == (2, "1", 5, 4)
    assert (facts.write_errors, facts.sync_fallbacks, facts.queue_depth) == (1, 1, 1)
    assert (facts.pool_bytes_in_use, facts.pool_bytes_max) == (100, 2 << 30)
    assert facts.write_seconds == 0.5 and facts.hook_seconds == 0.25 and facts.read_ts == 5.0
    assert facts.hook_seconds_p50 == 0.0003 and facts.hook_seconds_p99 == 0.04  # nearest rank of 5
    # a server without the plugin, or whose schedulers do not report (yet): no capture section
    assert parse_capture({"internal_states": [{"hsmon_capture": {}}]}, 1.0) is None
    assert parse_capture({"hsmon_plugin": {"version": "1"}, "internal_states": [{}]}, 1.0) is None
    assert parse_capture({"hsmon_plugin": {"version": "1"}}, 1.0) is None
    odd = {"hsmon_plugin": {}, "internal_states": [{"hsmon_capture": {"requests": "x"}}]}
    empty = parse_capture(odd, 1.0)
    assert empty is not None and empty.requests == 0 and empty.hook_seconds_p99 is None


def test_the_capture_section_names_the_sglang_release_and_adapter_and_status_shows_them():
    import msgspec

    from hsmon import status_doc
    from hsmon.core.trackers.server_capture import parse_capture
    from hsmon.status.cli import _server_summary
    from hsmon.tui.engine_view import capture_line

    states = [{"hsmon_capture": _plugin_snapshot(1, [0.2])}]
    info = {"hsmon_plugin": {"version": "1", "sglang_version": "0.5.18", "adapter": "layer-capture"},
            "internal_states": states}
    facts = parse_capture(info, now=1.0)
    assert facts is not None and (facts.sglang_version, facts.adapter) == ("0.5.18", "layer-capture")
    old = parse_capture({"hsmon_plugin": {"version": "1"}, "internal_states": states}, now=1.0)
    assert old is not None and old.sglang_version is None and old.adapter is None
    # optional in the document: absent when unknown (the v1 fixture's capture has neither)
    assert "sglang_version" not in msgspec.json.decode(msgspec.json.encode(old))
    assert msgspec.json.decode(msgspec.json.encode(facts))["adapter"] == "layer-capture"
    doc = status_doc.decode((Path(__file__).parent / "fixtures" / "status_document.json").read_bytes())
    server = msgspec.structs.replace(doc.jobs[0].servers[0], capture=facts)
    assert "SGLang 0.5.18, capture adapter layer-capture" in _server_summary(server)
    assert "SGLang 0.5.18 layer-capture" in capture_line(facts, 200).plain


def test_the_capture_section_names_the_class_its_sizes_rule_and_the_points_really_captured():
    import msgspec

    from hsmon import status_doc
    from hsmon.core.trackers.server_capture import parse_capture
    from hsmon.status.cli import _server_summary
    from hsmon.tui.engine_view import capture_line

    states = [{"hsmon_capture": _plugin_snapshot(1, [0.2])}]
    plugin = {"version": "1", "sglang_version": "0.5.23", "adapter": "aux-return",
              "model_class": "DeepseekV3ForCausalLM", "layer_ids": "3,31,59", "captured_points": "3,31,59"}
    facts = parse_capture({"hsmon_plugin": plugin, "internal_states": states, "tp_size": 8, "dp_size": 1,
                           "ep_size": 8}, now=1.0)
    assert facts is not None
    assert (facts.model_class, facts.tp_size, facts.ep_size, facts.capture_rule, facts.captured_points) == (
        "DeepseekV3ForCausalLM", 8, 8, "deepseek", [3, 31, 59])
    assert facts.writer == "attention-TP rank 0"
    unknown = parse_capture({"hsmon_plugin": {**plugin, "model_class": "NewForCausalLM"},
                             "internal_states": states}, now=1.0)
    assert unknown is not None and unknown.capture_rule is None and unknown.tp_size is None
    doc = status_doc.decode((Path(__file__).parent / "fixtures" / "status_document.json").read_bytes())
    server = msgspec.structs.replace(doc.jobs[0].servers[0], capture=facts)
    assert ("DeepseekV3ForCausalLM tp 8 ep 8, rule deepseek, captures points 3,31,59 "
            "(attention-TP rank 0 writes)") in _server_summary(server)
    assert "DeepseekV3ForCausalLM tp8 rule deepseek points 3,31,59" in capture_line(facts, 300).plain


def test_capture_counters_are_exported_as_counters_and_gauges_promtool_clean():
    import shutil
    import subprocess
    from pathlib import Path

    import msgspec

    from hsmon import status_doc
    from hsmon.core.trackers.server_capture import parse_capture
    from hsmon.metrics.engine_metrics import render_engine

    info = {"hsmon_plugin": {"version": "1"},
            "internal_states": [{"hsmon_capture": _plugin_snapshot(7, [0.5], write_errors=2)}]}
    # the recorded document (tests/fixtures/status_document.json) with its job's servers replaced
    doc = status_doc.decode((Path(__file__).parent / "fixtures" / "status_document.json").read_bytes())
    server = doc.jobs[0].servers[0]
    capture = parse_capture(info, 1.0)  # the status document's own Capture
    with_plugin = msgspec.structs.replace(server, url="http://a:1", capture=capture)
    without = msgspec.structs.replace(server, url="http://b:1", capture=None)
    job = msgspec.structs.replace(doc.jobs[0], job="x", servers=[with_plugin, without])
    text = render_engine(msgspec.structs.replace(doc, jobs=[job])).decode()
    assert 'hsmon_server_capture_requests_total{job="x",server="http://a:1"} 7.0' in text
    assert 'hsmon_server_capture_write_errors_total{job="x",server="http://a:1"} 2.0' in text
    assert 'hsmon_server_capture_pool_bytes_max{job="x",server="http://a:1"} 1.073741824e+09' in text
    assert 'hsmon_server_capture_hook_seconds_p99{job="x",server="http://a:1"} 0.0005' in text
    assert "# TYPE hsmon_server_capture_queue_depth gauge" in text
    assert 'server="http://b:1"' not in text.split("hsmon_server_capture_", 1)[1]  # nothing guessed
    if shutil.which("promtool"):
        lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
        assert lint.returncode == 0 and not (lint.stdout + lint.stderr).strip(), lint

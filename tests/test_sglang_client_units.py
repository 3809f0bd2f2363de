"""The sglang backend's pure parts without a server: backoff, server pool (pauses, give-up),
preflight verdicts on server-info documents, default concurrency, dump-dir backpressure and orphans.
The real-server behaviour is in test_extract_sglang.py."""

from __future__ import annotations

import io
import json
import random
import re
import threading
import time
from pathlib import Path

import pytest

from extractor.backends.sglang import preflight
from extractor.backends.sglang.dumpdir import DumpDir, row_of
from extractor.backends.sglang.pool import GiveUp, ServerPool, Stopped, backoff_delay
from extractor.writer import Progress
from hsmon.contracts import events as ev

# What SGLang 0.5.23's /server_info says for `hsmon sglang-serve --layers 2,4,5` (fields used).
INFO = {"model_path": "m", "enable_return_hidden_states": True, "enable_return_aux_hidden_states": True,
        "return_aux_hidden_state_layer_ids": [1, 3, 4], "disable_radix_cache": True, "pp_size": 1,
        "dtype": "float32", "chunked_prefill_size": 4096, "max_running_requests": None,
        "max_total_tokens": 8192,
        "hsmon_plugin": {"version": "1", "modes": ["dump", "pack"], "dump_root": "/dev/shm/hsmon"}}


def writer() -> tuple[ev.EventWriter, io.StringIO]:
    stream = io.StringIO()
    return ev.EventWriter("t", stream=stream), stream


def kinds(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_backoff_doubles_with_jitter_and_caps():
    rng = random.Random(1)
    for attempt in range(10):
        want = min(5.0, 0.25 * 2**attempt)
        got = backoff_delay(attempt, rng=rng)
        assert 0.5 * want <= got <= want
    assert backoff_delay(100) <= 5.0


def test_pool_spreads_by_load_pauses_when_all_down_resumes_and_gives_up(capsys):
    events, stream = writer()
    progress = Progress()
    pool = ServerPool(["http://a", "http://b"], events, progress, threading.Event(), give_up_s=0.2)
    assert pool.acquire() == "http://a" and pool.acquire() == "http://b" and pool.acquire() == "http://a"
    for url in ("http://a", "http://b", "http://a"):
        pool.release(url)
    pool.failed("http://a", "refused")
    assert progress.paused is None  # b is still up: no pause, a retry event
    assert pool.acquire() == "http://b"
    pool.release("http://b")
    pool.failed("http://b", "refused")
    assert progress.paused == "server"
    pause = [e for e in kinds(stream) if e["kind"] == "pause"]
    assert len(pause) == 1 and pause[0]["reason"] == "server" and pause[0]["url"] == "http://b"
    assert sorted(pause[0]["urls"]) == ["http://a", "http://b"]
    pool.failed("http://a", "refused")  # still down: no second pause
    assert [e["kind"] for e in kinds(stream)].count("pause") == 1
    # one line for the human on stderr per pause: why, what it waits for, how often
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("hsmon extract: paused (server): no SGLang server answers (") and "refused" in line
    assert "waiting for one to answer (gives up after 0.2s" in line
    assert line.endswith("checking with backoff, at most every 5s")
    pool.succeeded("http://a")
    resumed = capsys.readouterr().err  # "after 0s", or more where the machine stalled this thread
    assert re.match(r"hsmon extract: resumed \(server\) after \d+s: http://a answers", resumed)
    resume = [e for e in kinds(stream) if e["kind"] == "resume"]
    assert progress.paused is None and resume[0]["reason"] == "server" and resume[0]["url"] == "http://a"
    assert "retry" in [e["kind"] for e in kinds(stream)]
    pool.failed("http://a", "timeout")
    time.sleep(0.25)
    with pytest.raises(GiveUp, match=r"no SGLang server answered for .*\(--give-up-after"):
        pool.failed("http://a", "timeout")


def test_pool_wait_honours_a_stop():
    stop = threading.Event()
    pool = ServerPool(["http://a"], writer()[0], Progress(), stop)
    stop.set()
    with pytest.raises(Stopped):
        pool.wait(5.0)


def test_preflight_takes_the_layer_ids_from_a_layer_capture_plugin_and_names_the_release(capsys):
    # SGLang 0.5.18 (adapter layer-capture): no aux flags in /server_info, the plugin holds the ids
    plugin = {**INFO["hsmon_plugin"], "sglang_version": "0.5.18", "adapter": "layer-capture",
              "layer_ids": "1,3,4", "tested": True}
    info = {k: v for k, v in INFO.items() if k not in ("enable_return_aux_hidden_states",
                                                     "return_aux_hidden_state_layer_ids")}
    check({**info, "hsmon_plugin": plugin})
    with pytest.raises(preflight.PreflightError, match="captures SGLang layer ids \\[1, 3, 4\\]"):
        check({**info, "hsmon_plugin": plugin}, points=(1, 2, 3))
    with pytest.raises(preflight.PreflightError, match="--enable-return-aux-hidden-states"):
        check({**info, "hsmon_plugin": {**plugin, "adapter": "aux-return"}})  # 0.5.23 needs the flag
    facts = preflight.facts_of("http://s", {**info, "hsmon_plugin": plugin})
    assert preflight.release_line(facts) == "http://s: SGLang 0.5.18, capture adapter layer-capture"
    untested = preflight.facts_of("http://s", {**info, "hsmon_plugin": {**plugin, "tested": False}})
    assert "untested release: hsmon verify-data checks the first chunk" in preflight.release_line(untested)


def check(info: dict, points=(2, 4, 5), transport="shm", dtype="float32", dump_dir="/dev/shm/hsmon/j"):
    facts = preflight.facts_of("http://s", info)
    preflight.check_server(facts, list(points), transport, dtype, dump_dir)


def test_preflight_accepts_a_fitting_server_and_names_every_missing_flag():
    check(INFO)
    with pytest.raises(preflight.PreflightError) as exc:
        check({**INFO, "disable_radix_cache": False})
    assert "radix cache is on" in str(exc.value)
    assert str(exc.value).endswith("(hsmon sglang-serve sets them all)")
    assert "--disable-radix-cache" in str(exc.value) and "--enable-return" not in str(exc.value)
    with pytest.raises(preflight.PreflightError, match="--return-aux-hidden-state-layer-ids 0 1 2"):
        check(INFO, points=(1, 2, 3))
    with pytest.raises(preflight.PreflightError, match=r"relaunch the server with --dtype float32 .*or "
                       r"leave --dtype out to store the server's bfloat16"):
        check({**INFO, "dtype": "bfloat16"})
    with pytest.raises(preflight.PreflightError, match="plugin is not loaded"):
        check({k: v for k, v in INFO.items() if k != "hsmon_plugin"}, transport="json")
    with pytest.raises(preflight.PreflightError, match="under /dev/shm/hsmon only"):
        check(INFO, dump_dir="/tmp/elsewhere")
    with pytest.raises(preflight.PreflightError, match="pipeline parallelism"):
        check({**INFO, "pp_size": 2})


def test_default_concurrency_fills_the_batch_for_both_transports():
    # json no longer has to fit one prefill chunk: the plugin's pack mode keeps every piece
    facts = [preflight.facts_of("http://s", {**INFO, "chunked_prefill_size": 1000})]
    assert preflight.default_concurrency(facts, longest_row=300, transport="json") == 8
    assert preflight.default_concurrency(facts, longest_row=300, transport="shm") == 8
    two = [*facts, preflight.facts_of("http://t", {**INFO, "max_total_tokens": 1200})]
    assert preflight.default_concurrency(two, longest_row=300, transport="shm") == 8 + 4


def test_dump_dir_orphans_are_kept_by_row_temporaries_removed(tmp_path: Path):
    d = tmp_path / "dump"
    d.mkdir()
    (d / "r5-abcd1234-3.safetensors").write_bytes(b"x")
    (d / ".r6-abcd1234-4.safetensors.tmp").write_bytes(b"x")  # a server killed mid-write
    (d / "r8-abcd1234-5.error").write_text('{"error": "x", "errno": "ENOSPC"}\n')  # never a row
    (d / "unrelated.txt").write_text("keep")
    assert row_of("r5-abcd1234-3.safetensors") == 5 and row_of("other.safetensors") is None
    dump = DumpDir(d, 1 << 20, 0, writer()[0], Progress(), threading.Event())
    dump.prepare()
    assert not (d / ".r6-abcd1234-4.safetensors.tmp").exists() and not (d / "r8-abcd1234-5.error").exists()
    assert dump.take_orphan(8) is None
    assert dump.take_orphan(5) == d / "r5-abcd1234-3.safetensors" and dump.take_orphan(5) is None
    (d / "r7-ffff0000-1.safetensors").write_bytes(b"late")  # a request that finished after the end
    dump.clean()
    assert sorted(p.name for p in d.iterdir()) == ["unrelated.txt"]  # only what is not ours stays


def test_dump_dir_backpressure_pauses_until_files_are_consumed(tmp_path: Path, capsys):
    d = tmp_path / "dump"
    events, stream = writer()
    progress = Progress()
    dump = DumpDir(d, max_bytes=100, min_free=0, events=events, progress=progress,
                   stop_event=threading.Event(), poll_s=0.02)
    dump.prepare()
    big = d / "r1-00-1.safetensors"
    big.write_bytes(b"x" * 500)
    waiter = threading.Thread(target=dump.wait_for_room)
    waiter.start()
    deadline = time.monotonic() + 30  # the waiter's first look can come late on a loaded machine
    while progress.paused != "shm" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert waiter.is_alive() and progress.paused == "shm"
    big.unlink()
    waiter.join(5)
    assert not waiter.is_alive() and progress.paused is None
    pause, resume = [e for e in kinds(stream) if e["kind"] in ("pause", "resume")]
    assert pause["reason"] == "shm" and pause["limit"] == "max_dump_bytes" and pause["dump_bytes"] == 500
    assert resume["reason"] == "shm" and resume["paused_seconds"] > 0
    paused, resumed = capsys.readouterr().err.splitlines()  # one stderr line each
    assert paused == (
        f"hsmon extract: paused (shm): the dump directory {d} holds 500 B, over --max-dump-bytes 100 B; "
        "waiting for the server's dump files to be consumed (stop with SIGTERM), checking every 0.02s"
    )
    assert re.match(r"hsmon extract: resumed \(shm\) after \d+s: room again in ", resumed)


def test_longest_input_from_server_info_sets_the_default_and_refuses_a_longer_option():
    # SGLang 0.5.23 with --context-length 512 and an 8192-token KV pool: max_req_input_len 506,
    # and it refuses 506 tokens (measured: "Input length (506 tokens) exceeds the maximum allowed
    # length (506 tokens)"), while 505 goes through.
    small = preflight.facts_of("http://small", {**INFO, "context_length": 512, "max_req_input_len": 506})
    big = preflight.facts_of("http://big", {**INFO, "context_length": 4096, "max_req_input_len": 4090})
    assert small.max_input == 505 and big.max_input == 4089
    assert preflight.facts_of("http://s", {**INFO, "context_length": 512}).max_input == 511
    eagle = {**INFO, "context_length": 512, "speculative_algorithm": "EAGLE3", "speculative_eagle_topk": 1,
             "speculative_num_steps": 3, "speculative_num_draft_tokens": 4}
    assert preflight.facts_of("http://s", eagle).max_input == 512 - 1 - 4
    assert preflight.resolve_max_length(None, [small, big], 2048) == 505  # the smallest server's
    assert preflight.resolve_max_length(1000, [small, big], 2048) == 1000  # big takes it
    with pytest.raises(preflight.PreflightError) as exc:
        preflight.resolve_max_length(600, [small], 2048)
    assert str(exc.value).startswith("--max-length 600: no server accepts inputs that long: http://small "
                                     "takes at most 505 tokens (context length 512")
    assert "pass --max-length 505 or less" in str(exc.value) and "\n" not in str(exc.value)
    unknown = preflight.facts_of("http://old", INFO)  # a server that does not say
    assert unknown.max_input is None
    assert preflight.resolve_max_length(None, [unknown], 2048) == 2047  # one position to generate
    assert preflight.resolve_max_length(5000, [unknown], 2048) == 5000  # its own refusal will tell


def test_pool_sends_a_row_only_to_servers_that_take_its_length():
    pool = ServerPool(["http://small", "http://big"], writer()[0], Progress(), threading.Event(),
                      max_input={"http://small": 505, "http://big": 4089})
    long_row = [pool.acquire(1000) for _ in range(3)]
    assert long_row == ["http://big"] * 3  # even with big busy
    assert pool.acquire(100) == "http://small"


def test_server_message_is_the_servers_own_words_on_one_line():
    from extractor.backends.sglang.transports import server_message

    body = ('{"error":{"message":"The input (512 tokens) is longer than the model\'s context length '
            '(512 tokens)."}}')
    assert server_message(400, body) == \
        "The input (512 tokens) is longer than the model's context length (512 tokens)."
    assert server_message(422, '{"detail": "bad\\n request"}') == "bad request"
    assert server_message(404, "Not Found") == "Not Found" and server_message(400, "") == "HTTP 400"


def test_reject_reasons_are_classed_and_summed_up_for_a_person():
    from hsmon.contracts.rejects import classify, count_by_class, short_summary, summary

    reasons = ["refused by the server (HTTP 400 from http://s): The input (512 tokens) is longer than the "
               "model's context length (512 tokens).",
               "refused by the server (HTTP 400 from http://s): Input length (506 tokens) exceeds the "
               "maximum allowed length (506 tokens).",
               "refused by the server (HTTP 422 from http://s): bad field",
               "failed on the server 3 times while it answered other requests (last: http://s: HTTP 500: x)",
               "the model failed on this row alone (9000 tokens): OutOfMemoryError: CUDA out of memory",
               "token id 5000 outside the vocabulary (0..2047)", "too long: 600 tokens > max length 505",
               "invalid JSON: Expecting value"]
    assert [classify(r) for r in reasons] == ["server_too_long", "server_too_long", "server_refused",
                                              "server_failing", "out_of_memory", "out_of_vocabulary",
                                              "too_long", "invalid_row"]
    counts = count_by_class(reasons[:2] + reasons[5:6])
    assert summary(counts) == ("1 row with a token id outside the vocabulary; 2 rows refused by the server: "
                               "input longer than context")
    assert short_summary(counts) == "1 vocabulary, 2 server: too long" and summary({}) == ""


def test_a_success_while_the_pause_begins_leaves_the_run_unpaused():
    # The last server fails on one thread while another request on it succeeds. The pause is
    # decided and begun under the pool's lock, so the success either comes first (no pause) or
    # after (it ends the pause): the run is never left paused with a server that answers. The
    # interleaving is forced: the pause's begin waits (up to 0.5 s) for the success to happen.
    events, _ = writer()
    progress = Progress()
    pool = ServerPool(["http://a"], events, progress, threading.Event())
    real_begin = pool._pause.begin
    success_started, success_done = threading.Event(), threading.Event()

    def slow_begin(*args, **kwargs):
        success_started.set()
        success_done.wait(0.5)  # with the fix, the success waits for this lock: the wait times out
        return real_begin(*args, **kwargs)

    pool._pause.begin = slow_begin

    def succeed():
        success_started.wait(5)
        pool.succeeded("http://a")
        success_done.set()

    thread = threading.Thread(target=succeed)
    thread.start()
    pool.failed("http://a", "HTTP 503")
    thread.join(5)
    assert not pool._pause.active and progress.paused is None
    assert pool.acquire() == "http://a"


def test_the_dtype_a_server_computes_in_is_the_plugins_word_then_its_flag_then_sglangs_auto_rule():
    """`--dtype auto` on the server is not a dtype: SGLang serves float32 weights in float16. The
    plugin says what SGLang resolved; without it, its flag; with auto, SGLang's rule on the config."""
    auto = {**INFO, "dtype": "auto"}
    plugin = {**INFO["hsmon_plugin"], "dtype": "float16"}
    assert preflight.computes_of({**auto, "hsmon_plugin": plugin}) == "float16"
    assert preflight.computes_of({**INFO, "dtype": "half"}) == "float16"
    assert preflight.computes_of(auto) is None
    assert preflight.sglang_auto_dtype("float32", "llama") == "float16"
    assert preflight.sglang_auto_dtype("float32", "gemma2") == "bfloat16"
    assert preflight.sglang_auto_dtype("bfloat16", "llama") == "bfloat16"
    a, b = preflight.facts_of("http://a", {**INFO, "dtype": "float16"}), preflight.facts_of("http://b", INFO)
    assert preflight.agreed_dtype([a]) == "float16"
    with pytest.raises(preflight.PreflightError, match=r"^--url http://b computes in float32, --url http://a "
                       r"in float16: a run stores one dtype; relaunch http://b with --dtype float16$"):
        preflight.agreed_dtype([a, b])

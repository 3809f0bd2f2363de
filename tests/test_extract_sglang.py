"""`hsmon extract --backend sglang` and `hsmon verify-data` against a REAL SGLang server on CPU.

One server for the module (the embedded target, fp32, capture points 2,4,5) with a small
``--chunked-prefill-size``, so that the chunked-prefill trap is real: rows cut to 60 tokens pass
whole over json; longer rows come back short over json and whole through the plugin's dump. Its
``--context-length 512`` makes rows at and beyond the server's context cheap to send.
The server is killed and restarted by the kill tests (the second as a slow writer, then as it
was); a plain SGLang launch without the capture flags is started for the preflight test.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from daemon_helpers import Daemon, Procs, wait_until
from extract_helpers import (
    events_of,
    extract_cmd,
    extract_env,
    load_output,
    make_dataset,
    run_extract,
    start_extract,
    wait_for_event,
)
from fake_sglang_proxy import FakeSGLangProxy
from sglang_server import (  # noqa: F401 (capture_workdir, capture_server: session fixtures)
    CAPTURE_CHUNK,
    CAPTURE_CONTEXT,
    EMBEDDED_MODEL,
    IDLE_ARGS,
    SGLangServer,
    capture_server,
    capture_workdir,
    free_port,
    sglang_python,
    start_sglang_server,
)

from hsmon.contracts import layout

pytestmark = pytest.mark.slow
# client_side: what the test proves is the client's (a wait, a retry, a check of its own), the real
# server only answers as on any release: run on the newest by make test, not again on each older
# release by make test-sglang-matrix (its time).

CHUNK = CAPTURE_CHUNK  # the server's --chunked-prefill-size
CONTEXT = CAPTURE_CONTEXT  # the server's --context-length
SHORT = ("--max-length", "60")  # rows that fit one prefill chunk
MODEL = EMBEDDED_MODEL


@pytest.fixture(scope="module")
def workdir(capture_workdir):  # noqa: F811
    """The shared server's directory (its dump root is workdir/dump), this module's files in it."""
    return capture_workdir


@pytest.fixture(scope="module")
def plain_server(workdir):
    """A plain SGLang launch (no capture flags, radix cache on: SGLang's defaults), started first
    and not waited for, so that its start overlaps the other tests; the preflight test waits."""
    port = free_port()
    log = open(workdir / "plain-sglang.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [str(sglang_python()), "-m", "sglang.launch_server", "--model-path", str(MODEL), "--device", "cpu",
         "--host", "127.0.0.1", "--port", str(port), "--nccl-port", str(free_port()), "--attention-backend",
         "torch_native", "--dtype", "float32", "--max-total-tokens", "4096", *IDLE_ARGS],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1",
             "PYTHONPATH": str(Path(__file__).parent / "sglang_stubs")})
    try:
        yield f"http://127.0.0.1:{port}", proc
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        log.close()


@pytest.fixture(scope="module")
def server(plain_server, capture_server):  # noqa: F811
    """The session's capture server (tests/sglang_server.py), after the plain launch has started."""
    return capture_server


@pytest.fixture(scope="module")
def data_short(workdir):
    return make_dataset(workdir / "short.jsonl", rows=10, seed=5)


@pytest.fixture(scope="module")
def data_long(workdir):
    """Rows of 100-300 tokens: several prefill chunks each."""
    return make_dataset(workdir / "long.jsonl", rows=6, seed=7, min_lines=6, max_lines=12)


@pytest.fixture(scope="module")
def hf_short(workdir, data_short):
    out = workdir / "hf-short"
    proc = run_extract(data_short, out, MODEL, *SHORT)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def hf_long(workdir, data_long):
    out = workdir / "hf-long"
    proc = run_extract(data_long, out, MODEL)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def shm_long(workdir, data_long, server):
    """The long rows through the dump (default concurrency): the uninterrupted reference."""
    out = workdir / "shm-long"
    events = workdir / "shm-long.jsonl"
    proc = run_extract(data_long, out, MODEL, *sglang_args(server, workdir, "shm", "long"), events=events)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def json_short(workdir, server, data_short):
    """The short rows extracted by the server over json (one at a time): data that server made."""
    out, events = workdir / "json-short", workdir / "json-short.jsonl"
    proc = run_extract(data_short, out, MODEL, *SHORT, "--concurrency", "1",
                       *sglang_args(server, workdir, "json", "short"), events=events)
    assert proc.returncode == 0, proc.stderr
    return out, events


@pytest.fixture(scope="module")
def perturbed(workdir, data_short):
    """(model, output): a copy of the target with layer 3's MLP scaled by 1.05, and the short rows
    extracted with it by transformers: data whose weights differ from the server's."""
    other_model = workdir / "perturbed-model"
    shutil.copytree(MODEL, other_model)
    from safetensors.torch import load_file, save_file

    weights = load_file(other_model / "model.safetensors")
    key = next(k for k in weights if "layers.3.mlp.down_proj" in k)
    weights[key] = weights[key] * 1.05
    save_file(weights, other_model / "model.safetensors", metadata={"format": "pt"})
    other = workdir / "hf-perturbed"
    proc = run_extract(data_short, other, other_model, *SHORT)
    assert proc.returncode == 0, proc.stderr
    return other_model, other


def sglang_args(server: SGLangServer, workdir: Path, transport: str, name: str, *extra: str) -> list[str]:
    args = ["--backend", "sglang", "--url", server.url, "--transport", transport, *extra]
    if transport == "shm":
        args += ["--dump-dir", str(dump_dir(workdir, name))]
    return args


def dump_dir(workdir: Path, name: str) -> Path:
    return workdir / "dump" / name


def assert_close(got: Path, want: Path, atol: float, exact_ids: bool = True) -> None:
    a, b = load_output(got), load_output(want)
    assert sorted(a) == sorted(b) and a
    for row in a:
        assert torch.equal(a[row]["input_ids"], b[row]["input_ids"])
        assert torch.equal(a[row]["loss_mask"], b[row]["loss_mask"])
        for key in ("hidden_state", "aux_hidden_state"):
            assert a[row][key].shape == b[row][key].shape and a[row][key].dtype == b[row][key].dtype
            diff = float((a[row][key] - b[row][key]).abs().max())
            assert diff <= atol, f"row {row} {key}: max abs diff {diff} > {atol}"


def test_both_transports_equal_hf_and_each_other(workdir, server, data_short, hf_short, json_short):
    outs = {}
    for transport in ("json", "shm"):
        out = workdir / f"{transport}-short"
        events = workdir / f"{transport}-short.jsonl"
        if transport == "shm":
            proc = run_extract(data_short, out, MODEL, *SHORT, "--concurrency", "1",
                               *sglang_args(server, workdir, transport, "short"), events=events)
            assert proc.returncode == 0, proc.stderr
        start = events_of(events)[0]
        assert start["backend"] == "sglang" and start["urls"] == [server.url]
        assert start["transport"] == transport
        assert events_of(events)[-1]["kind"] == "done"
        assert_close(out, hf_short, atol=1e-4)  # last layer included
        outs[transport] = load_output(out)
    for row, data in outs["json"].items():
        for key, tensor in data.items():
            assert torch.equal(tensor, outs["shm"][row][key]), f"row {row} {key}: json and shm differ"
    assert not dump_dir(workdir, "short").exists() or not any(dump_dir(workdir, "short").iterdir())
    # Two --url (two names of the one server: data parallelism as the client sees it): both serve.
    other_name = server.url.replace("127.0.0.1", "localhost")
    out = workdir / "two-urls"
    events = workdir / "two-urls.jsonl"
    proc = run_extract(data_short, out, MODEL, *SHORT, "--concurrency", "2", "--url", other_name,
                       *sglang_args(server, workdir, "shm", "two"), events=events)
    assert proc.returncode == 0, proc.stderr
    assert events_of(events)[0]["urls"] == [other_name, server.url]
    per_server = proc.stderr.split("per server: ")[1].splitlines()[0]
    assert all(int(part.split()[-1]) > 0 for part in per_server.split(", ")), per_server
    assert_close(out, hf_short, atol=1e-4)


def test_json_returns_rows_four_times_the_prefill_chunk_whole(workdir, server, data_long, hf_long, shm_long):
    # Rows of 4x the server's --chunked-prefill-size and more, 4 in flight (so they also share
    # prefill batches): the plugin's pack mode keeps every chunked-prefill piece, so json equals
    # transformers; before, this stopped with "returned hidden states for 64 of 256 tokens".
    import random

    rng = random.Random(21)
    data = workdir / "json-4x.jsonl"
    data.write_text("".join(json.dumps({"input_ids": [rng.randint(3, 2000) for _ in range(n)]}) + "\n"
                            for n in (4 * CHUNK, 4 * CHUNK, 4 * CHUNK + 17, 5 * CHUNK, 4 * CHUNK + 1, 300)))
    ref = workdir / "hf-4x"
    proc = run_extract(data, ref, MODEL)
    assert proc.returncode == 0, proc.stderr
    out = workdir / "json-4x"
    proc = run_extract(data, out, MODEL, *sglang_args(server, workdir, "json", "4x", "--concurrency", "4"))
    assert proc.returncode == 0, proc.stderr
    assert_close(out, ref, atol=1e-4)
    assert min(d["input_ids"].shape[0] for d in load_output(out).values()) == 4 * CHUNK
    assert_close(shm_long, hf_long, atol=1e-4)  # and shm, on the long rows of the module


def wait_plain(workdir, plain_server) -> str:
    """The plain server's URL once it answers /health (it was started without waiting)."""
    url, plain = plain_server
    deadline = time.monotonic() + 420
    while True:
        with contextlib.suppress(OSError), urllib.request.urlopen(url + "/health", timeout=5) as resp:
            if resp.status == 200:
                return url
        assert plain.poll() is None and time.monotonic() < deadline, \
            (workdir / "plain-sglang.log").read_text()
        time.sleep(1)


def test_preflight_names_the_flags_to_add(workdir, server, plain_server, data_short):
    # Wrong layers on the real server: one line naming the flag, exit 2, before any row.
    proc = run_extract(data_short, workdir / "wrong-layers", MODEL, "--layers", "1,2,3",
                       *sglang_args(server, workdir, "json", "x"))
    assert proc.returncode == 2 and [line for line in proc.stderr.splitlines() if "--url" in line] == \
        proc.stderr.strip().splitlines()[-1:], proc.stderr
    # the points the server's class really captures (read back by the plugin), and both ways out
    assert "LlamaForCausalLM on the server captures points 2,4,5" in proc.stderr
    assert "hsmon sglang-serve --layers 1,2,3, or pass --layers 2,4,5" in proc.stderr
    assert not (workdir / "wrong-layers" / "rows_0-2000").exists()
    # A plain SGLang launch: no capture flags, radix cache on (SGLang's default).
    url = wait_plain(workdir, plain_server)
    proc = run_extract(data_short, workdir / "plain", MODEL, "--backend", "sglang", "--url", url,
                       "--transport", "json")
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and "relaunch it with" in last, proc.stderr
    assert sum("relaunch" in line for line in proc.stderr.splitlines()) == 1
    for flag in ("--enable-return-hidden-states", "--enable-return-aux-hidden-states",
                 "--return-aux-hidden-state-layer-ids 1 3 4", "--disable-radix-cache"):
        assert flag in proc.stderr, proc.stderr
    assert "radix cache is on" in proc.stderr


@pytest.mark.client_side
def test_preflight_waits_for_a_server_that_still_loads(workdir, server, data_short):
    """The extract unit starts beside a server that loads its model for minutes: with
    --wait-for-server it waits (a progress line) and goes on once the server answers; without, it
    refuses at once. The late server is the real one behind a proxy that starts listening late."""
    port = free_port()
    late = FakeSGLangProxy(server.url, port=port)
    url = f"http://127.0.0.1:{port}"
    refused = run_extract(data_short, workdir / "no-wait", MODEL, *SHORT, "--backend", "sglang", "--url", url,
                          "--transport", "json", "--dry-run")
    assert refused.returncode == 2 and "no SGLang server answers" in refused.stderr.strip().splitlines()[-1]
    cmd = extract_cmd(data_short, workdir / "waited", MODEL, *SHORT, "--backend", "sglang", "--url", url,
                      "--transport", "json", "--wait-for-server", "120", "--dry-run")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=extract_env())
    try:
        lines = []
        for line in proc.stderr:  # the server comes up only once the client says it waits
            lines.append(line)
            if "waiting for --url" in line:
                late.start()
                break
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        late.stop()
    waited = subprocess.CompletedProcess(cmd, proc.returncode, out, "".join(lines) + err)
    assert waited.returncode == 0, waited.stderr
    assert f"waiting for --url {url} to answer" in waited.stderr


def test_the_status_capture_section_is_null_without_the_plugin(workdir, server, plain_server):
    # The server tracker's entry (servers[i] of the status document) of each real server, after
    # one look and one forward check: the plugin's counters where `hsmon sglang-serve` loaded it,
    # null for a plain SGLang launch (its /server_info read all the same).
    from hsmon.core.config import ServerSpec
    from hsmon.core.trackers.server import ServerTracker

    entries = {}
    for name, url in (("plain", wait_plain(workdir, plain_server)), ("plugin", server.url)):
        tracker = ServerTracker(ServerSpec(url, health_timeout=120))
        tracker.look()
        tracker.check_forward()
        entries[name] = tracker.snapshot(time.time())
    assert entries["plain"].health.ok is True and entries["plain"].info.version, entries["plain"]
    assert entries["plain"].capture is None
    capture = entries["plugin"].capture
    assert capture is not None and capture.plugin_version == "1" and capture.schedulers == 1, capture
    assert capture.pool_bytes_max > 0 and capture.write_errors == 0


def test_verify_data_agrees_with_the_engine_and_catches_other_weights(workdir, server, hf_short, perturbed):
    ok = subprocess.run([sys.executable, "-m", "hsmon", "verify-data", str(hf_short), "--against", server.url,
                         "--sample", "3", "--json"], capture_output=True, text=True, env=extract_env(),
                        timeout=300)
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert report["verdict"] == "agree" and set(report["layers"]) == {"final", "2", "4", "5"}
    assert all(r["max_abs_diff"] <= 1e-4 for r in report["layers"].values())
    # Data made by a model whose weights differ from the server's (layer 3's MLP scaled by 1.05).
    _, other = perturbed
    bad = subprocess.run([sys.executable, "-m", "hsmon", "verify-data", str(other), "--against", server.url,
                          "--sample", "3", "--model", str(MODEL)], capture_output=True, text=True,
                         env=extract_env(), timeout=300)
    assert bad.returncode == 1, bad.stderr
    assert "DISAGREE" in bad.stdout and "layer      2" in bad.stdout
    lines = {line.split(":")[0].split()[-1]: line
             for line in bad.stdout.splitlines() if line.startswith("layer")}
    assert lines["2"].endswith("ok") and lines["5"].endswith("DIFFERS") and lines["final"].endswith("DIFFERS")


@pytest.mark.client_side
def test_an_untested_release_gets_its_first_chunk_checked_against_transformers(workdir, server, data_short,
                                                                              perturbed):
    """A server on a release outside the tested set (sglang-serve --allow-untested-sglang): the real
    server, its release relabelled 0.5.20 (tested: false) by the proxy. By default the first chunk
    is re-extracted by transformers: AGREE lets the run go on; dumps that are not what the named
    model computes (the server runs the target, the run names the perturbed copy) DISAGREE and the
    run ends in an error with its rows kept; --skip-first-chunk-check runs no check."""
    proxy = FakeSGLangProxy(server.url, untested="0.5.20").start()
    args = (*SHORT, "--chunk-size", "4", "--backend", "sglang", "--url", proxy.url, "--transport", "json")
    other_model, _ = perturbed
    try:
        ok = run_extract(data_short, workdir / "untested-ok", MODEL, *args)
        bad = run_extract(data_short, workdir / "untested-bad", other_model, *args)
        skipped = run_extract(data_short, workdir / "untested-skip", other_model, *args,
                              "--skip-first-chunk-check")
    finally:
        proxy.stop()
    assert ok.returncode == 0, ok.stderr
    assert "SGLang 0.5.20, capture adapter" in ok.stderr and "untested release" in ok.stderr
    assert "first-chunk check: AGREE: 4 rows of rows_0-4 match transformers" in ok.stderr, ok.stderr
    assert sorted(load_output(workdir / "untested-ok")) == list(range(10))
    assert bad.returncode == 1, bad.stderr
    error = [line for line in bad.stderr.splitlines() if "first-chunk check: DISAGREE" in line]
    assert error and "of rows_0-4 differ from transformers" in error[0] and "0.5.20" in error[0], bad.stderr
    assert set(range(4)) <= set(load_output(workdir / "untested-bad"))  # the rows written are kept
    assert skipped.returncode == 0, skipped.stderr
    assert "first-chunk check skipped (--skip-first-chunk-check)" in skipped.stderr
    assert "AGREE" not in skipped.stderr and "DISAGREE" not in skipped.stderr


@pytest.mark.client_side
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed: run `make sysdeps`")
def test_daemon_engine_check_agrees_on_server_data_and_pages_on_other_weights(workdir, server, json_short,
                                                                              perturbed):
    """`verify_every = 1` against the real server: data that server made agrees; data from the
    perturbed copy of the target DISAGREES: a critical hint naming the chunk, and HsmonEngineMismatch
    firing in a real Prometheus loaded with the committed rules (the good job's stays quiet)."""
    from prometheus_helpers import Prometheus

    config = workdir / "verify.toml"
    config.write_text("[daemon]\nscan_interval = 0.5\n" + "".join(
        f'[[job]]\nname = "{name}"\nkind = "extract"\nout_dir = "{out}"\nverify_every = 1\n'
        f'verify_against = "{server.url}"\nverify_sample = 2\nverify_budget = 300\n'
        for name, out in (("good", json_short[0]), ("bad", perturbed[1]))))
    procs = Procs()
    try:
        daemon = Daemon(procs, workdir, ["--config", str(config)])
        prom = Prometheus(procs, workdir, [daemon.url.removeprefix("http://")])

        def checked() -> dict | None:
            jobs = {j["job"]: j for j in daemon.status()["jobs"]}
            verdicts = [j["output"]["data"]["verify"]["verdict"] for j in jobs.values()]
            return jobs if all(v not in (None, "running") for v in verdicts) else None

        jobs = wait_until(checked, 300, interval=0.5, what="both engine checks")
        good, bad = (jobs[n]["output"]["data"]["verify"] for n in ("good", "bad"))
        assert good["verdict"] == "agree" and good["chunk"] == "rows_0-2000", good
        assert good["rows_checked"] == 2
        assert good["max_abs_diff"] <= 1e-4 and good["against"] == server.url
        assert not [h for h in jobs["good"]["hints"] if h["severity"] == "critical"]
        assert bad["verdict"] == "disagree" and bad["disagreements_total"] == 1, bad
        assert re.match(r"layers final, (4, )?5 differ", bad["reason"]), bad
        (hint,) = [h for h in jobs["bad"]["hints"] if h["id"] == "engine-mismatch"]
        assert hint["severity"] == "critical"
        assert hint["message"].startswith(f"the data at rows 0-2000 is not what the engine computes: 2 rows "
                                          f"re-extracted by {server.url} disagree")
        worst = f"worst cosine {bad['worst_cosine']:.6f}, max abs diff {bad['max_abs_diff']:.3g}"
        assert worst in hint["message"]
        assert bad["max_abs_diff"] > 10 * good["max_abs_diff"]  # here the max diff is what differs
        firing = wait_until(lambda: [a for a in prom.alerts("HsmonEngineMismatch") if a["state"] == "firing"],
                            60, interval=0.5, what="HsmonEngineMismatch firing in /api/v1/alerts")
        assert [(a["labels"]["job"], a["labels"]["severity"]) for a in firing] == [("bad", "critical")]
        # Prometheus's newest scrape may predate the good job's verdict (the alert needs only the bad
        # job's): wait for a scrape that has it
        def agreed() -> bool:
            found = prom.query('hsmon_verify_checks_total{job="good",verdict="agree"}')
            return bool(found) and found[0]["value"][1] == "1"

        wait_until(agreed, 30, interval=0.5, what="the good job's agree counted in Prometheus")
    finally:
        procs.close()


def test_kill_9_client_with_shm_resumes_without_orphans(workdir, server, data_long, shm_long):
    """The client is killed with -9 mid-run while a request is on its way: the server answers it
    after the client is gone (its dump files are orphans), and the next run leaves none. Mid-run
    whatever the machine's speed: a proxy passes the first /generate and holds the next until
    the client is dead."""
    out = workdir / "killed-client"
    events = workdir / "killed-client.jsonl"
    proxy = FakeSGLangProxy(server.url, hold_after=1).start()
    args = ["--backend", "sglang", "--url", proxy.url, "--transport", "shm", "--dump-dir",
            str(dump_dir(workdir, "killed")), "--batch-tokens", "256", "--concurrency", "2"]
    procs = Procs()
    try:
        daemon = Daemon(procs, workdir, ["--job", "extract-killed-client", "--dump-dir",
                                         str(dump_dir(workdir, "killed")), "--events", str(events),
                                         "--scan-interval", "0.2"])
        proc = start_extract(data_long, out, MODEL, *args, events=events)
        wait_until(lambda: proxy.held >= 1 or proc.poll() is not None, 300, what="a request held mid-run")
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proxy.release()  # the held request reaches the server after its client died
        time.sleep(1.0)  # requests in flight at the kill finish on the server: orphans
        again = run_extract(data_long, out, MODEL, *args, events=events)
        assert again.returncode == 0, again.stderr
        assert_close(out, shm_long, atol=1e-5)
        assert not dump_dir(workdir, "killed").exists() or not any(dump_dir(workdir, "killed").iterdir())
        dump = wait_until(lambda: (lambda d: d if d["files"] == 0 else None)(daemon.job()["dump"]), 10,
                          what="dump dir empty in the daemon")
        assert dump["created_total"] > 0 and dump["consumed_total"] > 0, dump
        daemon.stop()
    finally:
        procs.close()
        proxy.stop()


SLOW_WRITER = {"HSMON_PLUGIN_WRITE_DELAY_S": "1.0"}  # the plugin's writer takes 1 s a file


def test_server_killed_and_restarted_pauses_then_resumes(workdir, server, data_long, shm_long):
    """The real server is killed with -9 mid-run, then started again: a pause, then a resume, and
    every row as an uninterrupted run's. The kill lands mid-run whatever the machine's speed: the
    client talks through a proxy that passes its first /generate and holds the next until the
    server is dead (a 6-row run took 0.18 s here, and once ended before the kill)."""
    out = workdir / "server-killed"
    events = workdir / "server-killed.jsonl"
    proxy = FakeSGLangProxy(server.url, hold_after=1, as_dead=True).start()
    args = ["--backend", "sglang", "--url", proxy.url, "--transport", "shm", "--dump-dir",
            str(dump_dir(workdir, "restart")), "--batch-tokens", "256", "--concurrency", "1"]
    proc = start_extract(data_long, out, MODEL, *args, events=events)
    try:
        wait_until(lambda: proxy.held >= 1 or proc.poll() is not None, 300, what="a request held mid-run")
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        server.kill()
        proxy.release()  # the held request meets the dead server
        pause = wait_for_event(events, lambda e: e["kind"] == "pause", proc)
        assert pause["reason"] == "server" and pause["url"] == proxy.url
        # Back as the slow writer the next test needs (a server start saved: each costs 25-150 s
        # here); one request in flight and the default 120 s dump wait: the files only come later.
        server.env = dict(SLOW_WRITER)
        server.start()
        resume = wait_for_event(events, lambda e: e["kind"] == "resume", proc)
        assert resume["reason"] == "server" and resume["paused_seconds"] > 0
        assert proc.wait(timeout=300) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
        proxy.stop()
    kinds = [e["kind"] for e in events_of(events)]
    assert kinds[-1] == "done" and "retry" in kinds
    assert_close(out, shm_long, atol=1e-5)


def test_server_killed_with_writes_queued_resumes_with_nothing_short(workdir, server, data_long, shm_long,
                                                                     monkeypatch):
    # A server whose writer thread is slow (1 s a file, made deterministic) is killed with -9
    # while responses are out and their files still queued: the client's waits time out (naming
    # the server and the request), the server reads down, the rows are sent again once it is
    # back, and no half-written .tmp is ever read as a row. The module's server, as the test
    # before left it (restarted as the slow writer; started so here when run alone), ends as it
    # began: restarted without the delay, for the tests after.
    monkeypatch.setenv("HSMON_DUMP_WAIT_S", "5")
    slow = server
    if slow.env != SLOW_WRITER:
        slow.stop()
        slow.env = dict(SLOW_WRITER)
        slow.start()
    out = workdir / "queued-kill"
    events = workdir / "queued-kill.jsonl"
    args = sglang_args(slow, workdir, "shm", "queued", "--batch-tokens", "256", "--concurrency", "4")
    proc = start_extract(data_long, out, MODEL, *args, events=events)
    try:
        wait_until(lambda: _queue_depth(slow) >= 2 or None, 120, interval=0.2, what="dump writes queued")
        slow.kill()
        pause = wait_for_event(events, lambda e: e["kind"] == "pause", proc)
        assert pause["reason"] == "server" and pause["url"] == slow.url
        slow.env = {}
        slow.start()
        assert proc.wait(timeout=300) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
        if slow.env or slow.proc is None or slow.proc.poll() is not None:
            slow.stop()  # failed half-way: the tests after get the module's server back
            slow.env = {}
            slow.start()
    kinds = [e["kind"] for e in events_of(events)]
    assert kinds[-1] == "done" and "resume" in kinds, kinds
    assert_close(out, shm_long, atol=1e-5)  # every row whole and equal to the uninterrupted run
    assert not dump_dir(workdir, "queued").exists() or not any(dump_dir(workdir, "queued").iterdir())
    late = [e["error"] for e in events_of(events) if e["kind"] in ("retry", "pause") and "did not appear" in
            e.get("error", "")]
    assert late and all(slow.url in m and "request r" in m for m in late), late


def _queue_depth(server: SGLangServer) -> int:
    with contextlib.suppress(OSError, ValueError, KeyError):
        info = json.loads(urllib.request.urlopen(server.url + "/server_info", timeout=10).read())
        return max(s["hsmon_capture"]["queue_depth"] for s in info["internal_states"])
    return 0


# -- rows the server refuses or fails on: rejects, and the run goes on ----------------------------
def edge_rows(workdir: Path) -> tuple[Path, dict[str, int], list[int]]:
    """Normal rows, one at exactly the server's context length, one with a token id beyond the
    vocabulary (2048) and one normal long row; returns the file, named row indices, the long row's ids."""
    import random

    normal = make_dataset(workdir / "edge-normal.jsonl", rows=4, seed=11).read_text().splitlines()
    rng = random.Random(3)
    exact = [rng.randint(3, 2000) for _ in range(CONTEXT)]
    long_row = [rng.randint(3, 2000) for _ in range(300)]
    lines = [*normal, json.dumps({"input_ids": exact}), json.dumps({"input_ids": [5, 6, 5000, 7]}),
             json.dumps({"input_ids": long_row})]
    path = workdir / "edge.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path, {"exact": 4, "vocab": 5, "long": 6}, long_row


def closing_line(stderr: str) -> str:
    return next(line for line in stderr.splitlines() if "done:" in line)


def rejects_of(out: Path) -> dict[int, dict]:
    return {r["row"]: r for r in layout.iter_jsonl(out / "rejects.jsonl")}


def done_record(out: Path) -> dict:
    return [r for r in layout.iter_jsonl(out / "hsmon-manifest.jsonl") if r.get("type") == "done"][-1]


def status_text(out: Path) -> str:
    proc = subprocess.run([sys.executable, "-m", "hsmon", "status", "--out", str(out), "--sample", "0.1"],
                          capture_output=True, text=True, timeout=120, env=extract_env())
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def edge(workdir):
    """The edge dataset and its transformers reference, cut to the server's longest input."""
    data, rows, long_row = edge_rows(workdir)
    out = workdir / "hf-edge"
    proc = run_extract(data, out, MODEL, "--max-length", str(CONTEXT - 7))
    assert proc.returncode == 0, proc.stderr
    return data, rows, long_row, out


def test_default_length_fits_the_server_and_bad_rows_are_rejects(workdir, server, edge):
    data, rows, _, hf_out = edge
    info = server.server_info()
    longest = min(info["max_req_input_len"] - 1, CONTEXT - 1)
    assert longest == CONTEXT - 7  # SGLang's scheduler keeps 5 positions besides the generated one
    out = workdir / "edge-default"
    proc = run_extract(data, out, MODEL, *sglang_args(server, workdir, "shm", "edge"))
    assert proc.returncode == 0, proc.stderr
    got = load_output(out)
    assert got[rows["exact"]]["input_ids"].shape[0] == longest  # truncated to fit, then extracted
    assert_close(out, hf_out, atol=1e-4)  # every other row too, equal to transformers
    # The out-of-vocabulary row never reaches the server: SGLang 0.5.23 does not check input ids,
    # and one such id kills its scheduler (IndexError in the embedding; seen on this server).
    assert "outside the vocabulary" in rejects_of(out)[rows["vocab"]]["reason"]
    assert "1 rejected: 1 row with a token id outside the vocabulary" in closing_line(proc.stderr)
    assert done_record(out)["rejects_by_reason"] == {"out_of_vocabulary": 1}
    # --no-truncate: the row at the context length is rejected instead, before any request.
    strict = workdir / "edge-strict"
    proc = run_extract(data, strict, MODEL, "--no-truncate", *sglang_args(server, workdir, "shm", "edge"))
    assert proc.returncode == 0, proc.stderr
    assert rejects_of(strict)[rows["exact"]]["class"] == "too_long"
    assert rows["exact"] not in load_output(strict) and rows["long"] in load_output(strict)
    assert re.search(r"rejects +2: 1 row longer than --max-length \(--no-truncate\); 1 row with a token id "
                     r"outside the vocabulary", status_text(strict)), status_text(strict)


def test_a_row_the_server_refuses_is_rejected_with_its_message(workdir, server, edge):
    """Through a FAKE proxy that hides the server's limits from /server_info (a server that does not
    publish them): the client's default falls back to the model's positions, and the REAL server
    refuses the row at its context length with HTTP 400."""
    from fake_sglang_proxy import FakeSGLangProxy

    data, rows, _, hf_out = edge
    proxy = FakeSGLangProxy(server.url, hide_limits=True).start()
    out = workdir / "edge-refused"
    events = workdir / "edge-refused.jsonl"
    args = ["--backend", "sglang", "--url", proxy.url, "--transport", "shm", "--dump-dir",
            str(dump_dir(workdir, "refused"))]
    try:
        proc = run_extract(data, out, MODEL, *args, events=events)
        assert proc.returncode == 0, proc.stderr
        reason = rejects_of(out)[rows["exact"]]["reason"]
        assert reason.startswith(f"refused by the server (HTTP 400 from {proxy.url}): ")
        assert f"The input ({CONTEXT} tokens) is longer than the model's context length" in reason
        assert "1 row refused by the server: input longer than context" in closing_line(proc.stderr)
        want, got = load_output(hf_out), load_output(out)
        assert sorted(got) == sorted(set(want) - {rows["exact"]})
        for row in got:
            assert float((got[row]["hidden_state"] - want[row]["hidden_state"]).abs().max()) <= 1e-4
        assert "1 row refused by the server: input longer than context" in status_text(out)
        # The same command again: the refused row is not sent again, the run is done at once.
        sent = proxy.forwarded
        again = run_extract(data, out, MODEL, *args, events=events)
        assert again.returncode == 0, again.stderr
        assert proxy.forwarded == sent and len(rejects_of(out)) == 2
        assert events_of(events)[-1]["rejects_by_reason"] == {"out_of_vocabulary": 1, "server_too_long": 1}
    finally:
        proxy.stop()


@pytest.mark.client_side
def test_a_poison_row_is_rejected_after_the_bounded_attempts(workdir, server, edge):
    """A FAKE proxy answers HTTP 500 to one row (and only to it); the real server does the rest."""
    from fake_sglang_proxy import FakeSGLangProxy

    data, rows, long_row, hf_out = edge
    proxy = FakeSGLangProxy(server.url, fail_ids=long_row).start()
    out = workdir / "edge-poison"
    events = workdir / "edge-poison.jsonl"
    try:
        proc = run_extract(data, out, MODEL, "--backend", "sglang", "--url", proxy.url, "--transport", "shm",
                           "--dump-dir", str(dump_dir(workdir, "poison")), "--row-attempts", "3",
                           "--concurrency", "1", events=events)
    finally:
        proxy.stop()
    assert proc.returncode == 0, proc.stderr
    assert proxy.failed == 3
    reason = rejects_of(out)[rows["long"]]["reason"]
    assert reason.startswith("failed on the server 3 times while it answered other requests (last: ")
    assert "HTTP 500" in reason and "fake proxy" in reason
    retries = [e for e in events_of(events) if e["kind"] == "retry"]
    assert [e["reason"] for e in retries] == ["row", "row"] and {e["row"] for e in retries} == {rows["long"]}
    assert not any(e["kind"] == "pause" for e in events_of(events))  # the server never looked down
    assert not dump_dir(workdir, "poison").exists()  # the control requests' dump files too
    want, got = load_output(hf_out), load_output(out)
    assert sorted(got) == sorted(set(want) - {rows["long"]})
    for row in got:
        assert float((got[row]["aux_hidden_state"] - want[row]["aux_hidden_state"]).abs().max()) <= 1e-4


def test_explicit_max_length_beyond_the_servers_context_is_refused_up_front(workdir, server, data_short):
    out = workdir / "too-long-option"
    proc = run_extract(data_short, out, MODEL, "--max-length", "600",
                       *sglang_args(server, workdir, "shm", "x"))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"--max-length 600: no server accepts inputs that long: {server.url} takes at most " \
           f"{CONTEXT - 7} tokens (context length {CONTEXT}" in lines[0]
    assert f"pass --max-length {CONTEXT - 7} or less" in lines[0]
    assert not out.exists()

"""`hsmon extract --backend sglang` and `hsmon verify-data` against a REAL SGLang server on CPU.

One server for the module (the embedded target, fp32, capture points 2,4,5) with a small
``--chunked-prefill-size``, so that the chunked-prefill trap is real: rows cut to 60 tokens pass
whole over json; longer rows come back short over json and whole through the plugin's dump.
The server is killed and restarted by the last test; a plain SGLang launch without the capture
flags is started for the preflight test.
"""

from __future__ import annotations

import contextlib
import json
import os
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
    extract_env,
    load_output,
    make_dataset,
    run_extract,
    start_extract,
    wait_for_event,
)
from sglang_server import EMBEDDED_MODEL, SGLangServer, free_port, sglang_python, start_sglang_server

pytestmark = pytest.mark.slow

CHUNK = 64  # the server's --chunked-prefill-size
SHORT = ("--max-length", "60")  # rows that fit one prefill chunk
MODEL = EMBEDDED_MODEL


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("sglang-extract")


@pytest.fixture(scope="module")
def plain_server(workdir):
    """A plain SGLang launch (no capture flags, radix cache on: SGLang's defaults), started first
    and not waited for, so that its start overlaps the other tests; the preflight test waits."""
    port = free_port()
    log = open(workdir / "plain-sglang.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [str(sglang_python()), "-m", "sglang.launch_server", "--model-path", str(MODEL), "--device", "cpu",
         "--host", "127.0.0.1", "--port", str(port), "--attention-backend", "torch_native", "--dtype",
         "float32", "--max-total-tokens", "4096"],
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
def server(workdir, plain_server):
    srv = start_sglang_server(MODEL, workdir, chunked_prefill_size=CHUNK, dump_root=workdir / "dump")
    try:
        yield srv
    finally:
        srv.stop()


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


def test_both_transports_equal_hf_and_each_other(workdir, server, data_short, hf_short):
    outs = {}
    for transport in ("json", "shm"):
        out = workdir / f"{transport}-short"
        events = workdir / f"{transport}-short.jsonl"
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


def test_chunked_prefill_json_refuses_short_rows_shm_writes_them_whole(workdir, server, data_long, hf_long,
                                                                      shm_long):
    out = workdir / "json-long"
    proc = run_extract(data_long, out, MODEL, *sglang_args(server, workdir, "json", "long"))
    assert proc.returncode == 1
    assert "--chunked-prefill-size" in proc.stderr and "--transport shm" in proc.stderr, proc.stderr
    assert "returned hidden states for" in proc.stderr
    for row, data in load_output(out).items():  # nothing short was written
        assert data["hidden_state"].shape[1] == data["input_ids"].shape[0], row
    assert_close(shm_long, hf_long, atol=1e-4)
    assert all(d["input_ids"].shape[0] > CHUNK for d in load_output(shm_long).values())


def test_preflight_names_the_flags_to_add(workdir, server, plain_server, data_short):
    # Wrong layers on the real server: one line naming the flag, exit 2, before any row.
    proc = run_extract(data_short, workdir / "wrong-layers", MODEL, "--layers", "1,2,3",
                       *sglang_args(server, workdir, "json", "x"))
    assert proc.returncode == 2 and [line for line in proc.stderr.splitlines() if "--url" in line] == \
        proc.stderr.strip().splitlines()[-1:], proc.stderr
    assert "--return-aux-hidden-state-layer-ids 0 1 2" in proc.stderr
    assert not (workdir / "wrong-layers" / "rows_0-2000").exists()
    # A plain SGLang launch: no capture flags, radix cache on (SGLang's default).
    url, plain = plain_server
    deadline = time.monotonic() + 420
    while True:
        with contextlib.suppress(OSError), urllib.request.urlopen(url + "/health", timeout=5) as resp:
            if resp.status == 200:
                break
        assert plain.poll() is None and time.monotonic() < deadline, \
            (workdir / "plain-sglang.log").read_text()
        time.sleep(1)
    proc = run_extract(data_short, workdir / "plain", MODEL, "--backend", "sglang", "--url", url,
                       "--transport", "json")
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and "relaunch it with" in last, proc.stderr
    assert sum("relaunch" in line for line in proc.stderr.splitlines()) == 1
    for flag in ("--enable-return-hidden-states", "--enable-return-aux-hidden-states",
                 "--return-aux-hidden-state-layer-ids 1 3 4", "--disable-radix-cache"):
        assert flag in proc.stderr, proc.stderr
    assert "radix cache is on" in proc.stderr


def test_verify_data_agrees_with_the_engine_and_catches_other_weights(workdir, server, data_short, hf_short):
    ok = subprocess.run([sys.executable, "-m", "hsmon", "verify-data", str(hf_short), "--against", server.url,
                         "--sample", "3", "--json"], capture_output=True, text=True, env=extract_env(),
                        timeout=300)
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert report["verdict"] == "agree" and set(report["layers"]) == {"final", "2", "4", "5"}
    assert all(r["max_abs_diff"] <= 1e-4 for r in report["layers"].values())
    # Data made by a model whose weights differ from the server's (layer 3's MLP scaled by 1.05).
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
    bad = subprocess.run([sys.executable, "-m", "hsmon", "verify-data", str(other), "--against", server.url,
                          "--sample", "3", "--model", str(MODEL)], capture_output=True, text=True,
                         env=extract_env(), timeout=300)
    assert bad.returncode == 1, bad.stderr
    assert "DISAGREE" in bad.stdout and "layer      2" in bad.stdout
    lines = {line.split(":")[0].split()[-1]: line
             for line in bad.stdout.splitlines() if line.startswith("layer")}
    assert lines["2"].endswith("ok") and lines["5"].endswith("DIFFERS") and lines["final"].endswith("DIFFERS")


def test_kill_9_client_with_shm_resumes_without_orphans(workdir, server, data_long, shm_long):
    out = workdir / "killed-client"
    events = workdir / "killed-client.jsonl"
    args = sglang_args(server, workdir, "shm", "killed", "--batch-tokens", "256", "--concurrency", "2")
    procs = Procs()
    try:
        daemon = Daemon(procs, workdir, ["--job", "extract-killed-client", "--dump-dir",
                                         str(dump_dir(workdir, "killed")), "--events", str(events),
                                         "--scan-interval", "0.2"])
        proc = start_extract(data_long, out, MODEL, *args, events=events)
        wait_for_event(events, lambda e: e["kind"] == "rows", proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
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


def test_server_killed_and_restarted_pauses_then_resumes(workdir, server, data_long, shm_long):
    out = workdir / "server-killed"
    events = workdir / "server-killed.jsonl"
    args = sglang_args(server, workdir, "shm", "restart", "--batch-tokens", "256", "--concurrency", "1")
    proc = start_extract(data_long, out, MODEL, *args, events=events)
    try:
        wait_for_event(events, lambda e: e["kind"] == "rows", proc)
        server.kill()
        pause = wait_for_event(events, lambda e: e["kind"] == "pause", proc)
        assert pause["reason"] == "server" and pause["url"] == server.url
        server.start()
        resume = wait_for_event(events, lambda e: e["kind"] == "resume", proc)
        assert resume["reason"] == "server" and resume["paused_seconds"] > 0
        assert proc.wait(timeout=300) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
    kinds = [e["kind"] for e in events_of(events)]
    assert kinds[-1] == "done" and "retry" in kinds
    assert_close(out, shm_long, atol=1e-5)

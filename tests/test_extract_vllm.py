"""`hsmon vllm-serve` + `hsmon extract --backend vllm` on real vLLM CPU servers (make test-vllm).

The targets are made here with transformers' own configs and random weights (tests/vllm_server.py),
independently of the project's embedded target: a dense Llama and a Qwen3-MoE. Each equals the
in-process extraction within 1e-5 in float32, rows == tokens, no vLLM file left behind; a client killed
with SIGKILL resumes tensor-equal; a server killed mid-run pauses the run, which resumes when it is
back; a row the server refuses is rejected; a server capturing other points is refused in one line.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from fake_sglang_proxy import FakeSGLangProxy
from vllm_server import ROOT, VLLMServer, make_tiny_qwen3_moe, vllm_python

pytestmark = pytest.mark.vllm
POINTS = [2, 4, 5]
SERVER_CONTEXT = 512  # vLLM's --max-model-len here: a longer row is the server's to refuse


def _dataset(path: Path, rows: int, seed: int = 0, longest: int = 300) -> Path:
    rng = random.Random(seed)
    with path.open("w") as fh:
        for _ in range(rows):
            fh.write(
                json.dumps(
                    {"input_ids": [1] + [rng.randrange(3, 2000) for _ in range(rng.randrange(4, longest))]}
                )
                + "\n"
            )
    return path


def extract(
    data: Path, out: Path, model: Path, *args: str, env: dict | None = None, wait: bool = True
) -> subprocess.CompletedProcess | subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "hsmon",
        "extract",
        str(data),
        "--out",
        str(out),
        "--model",
        str(model),
        "--layers",
        ",".join(map(str, POINTS)),
        "--events",
        str(out) + ".events.jsonl",
        *args,
    ]
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    if not wait:
        return subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=full_env
        )
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=600)


def rows_of(out: Path) -> dict[int, dict]:
    found = {}
    for path in out.glob("rows_*/data_*.ckpt"):
        found[int(path.stem.split("_")[1])] = torch.load(path, weights_only=True)
    return found


def worst_difference(a: Path, b: Path) -> float:
    left, right = rows_of(a), rows_of(b)
    assert left.keys() == right.keys() and left
    worst = 0.0
    for row, x in left.items():
        y = right[row]
        assert x["input_ids"].tolist() == y["input_ids"].tolist()
        seq = x["input_ids"].numel()
        assert y["hidden_state"].shape[1] == seq and y["aux_hidden_state"].shape[1] == seq  # rows == tokens
        for key in ("hidden_state", "aux_hidden_state"):
            worst = max(worst, (x[key].float() - y[key].float()).abs().max().item())
    return worst


def leftovers(dump: Path) -> list[str]:
    return sorted(set(os.listdir(dump)) - {"hsmon-vllm-serve.json"})


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    vllm_python()
    return tmp_path_factory.mktemp("vllm-extract")


@pytest.fixture(scope="module")
def server(vllm_llama_server):
    return vllm_llama_server  # the session's: points 2,4,5, SERVER_CONTEXT tokens (tests/vllm_server.py)


@pytest.fixture(scope="module")
def llama(server):
    return server.model_dir


@pytest.fixture(scope="module")
def dataset(work):
    return _dataset(work / "data.jsonl", 16)


@pytest.fixture(scope="module")
def in_process(work, llama, dataset):
    out = work / "hf"
    done = extract(dataset, out, llama, "--device", "cpu", "--dtype", "float32", "--max-length", "511")
    assert done.returncode == 0, done.stdout + done.stderr
    return out


@pytest.fixture(scope="module")
def served(work, server, dataset, llama):
    """One uninterrupted run at concurrency 1 (each request alone: the reference of the resume test)."""
    out = work / "vllm"
    done = extract(dataset, out, llama, "--backend", "vllm", "--url", server.url, "--concurrency", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    return out, done.stderr


def test_vllm_extraction_equals_in_process_with_no_file_left(served, in_process, server):
    out, log = served
    assert worst_difference(in_process, out) <= 1e-5
    assert leftovers(server.dump_root) == []
    assert "vLLM layer ids [2, 4, 5, 7]" in log  # the points by vLLM's rule, and the last layer's id
    run = next(json.loads(line) for line in (out / "hsmon-manifest.jsonl").open() if '"run"' in line)
    assert run["captured"]["engine"] == "vllm" and run["captured"]["servers"][0]["captured_points"] == POINTS
    assert "vllm: 16 requests" in log  # one prompt per request


def test_a_client_killed_mid_run_resumes_tensor_equal(work, server, dataset, llama, served):
    out = work / "resumed"
    args = ("--backend", "vllm", "--url", server.url, "--concurrency", "1", "--batch-tokens", "600")
    proc = extract(dataset, out, llama, *args, env={"HSMON_VLLM_READ_DELAY_S": "0.4"}, wait=False)
    manifest = out / "hsmon-manifest.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (
        not manifest.exists() or manifest.read_text().count('"type":"row"') < 3
    ):
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert 3 <= manifest.read_text().count('"type":"row"') < 16
    done = extract(dataset, out, llama, *args)
    assert done.returncode == 0, done.stdout + done.stderr
    reference = rows_of(served[0])
    for row, got in rows_of(out).items():
        for key in ("hidden_state", "aux_hidden_state", "input_ids"):
            assert torch.equal(got[key], reference[row][key]), (row, key)
    assert leftovers(server.dump_root) == []


def test_a_server_killed_mid_run_pauses_the_run_which_resumes_when_it_is_back(
    work, server, dataset, llama, in_process
):
    out = work / "paused"
    proc = extract(
        dataset,
        out,
        llama,
        "--backend",
        "vllm",
        "--url",
        server.url,
        "--concurrency",
        "1",
        "--batch-tokens",
        "600",
        "--give-up-after",
        "400",
        env={"HSMON_VLLM_READ_DELAY_S": "0.4"},
        wait=False,
    )
    events, manifest = Path(str(out) + ".events.jsonl"), out / "hsmon-manifest.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (
        not manifest.exists() or manifest.read_text().count('"type":"row"') < 2
    ):
        time.sleep(0.1)
    server.kill()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and '"kind":"pause"' not in events.read_text():
        time.sleep(0.2)
    assert '"kind":"pause"' in events.read_text(), events.read_text()[-2000:]
    server.start()
    output, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, output
    kinds = [json.loads(line) for line in events.open()]
    pauses = [e for e in kinds if e.get("kind") == "pause"]
    assert pauses and pauses[0]["reason"] == "server"
    assert any(e.get("kind") == "resume" and e.get("reason") == "server" for e in kinds)
    assert worst_difference(in_process, out) <= 1e-5
    assert leftovers(server.dump_root) == []


def test_a_row_the_server_refuses_is_rejected_and_the_others_are_written(work, server, llama):
    data = _dataset(work / "long.jsonl", 3, seed=5, longest=40)
    with data.open("a") as fh:  # longer than the server's context: vLLM answers 400
        fh.write(json.dumps({"input_ids": [1] + [7] * 700}) + "\n")
    proxy = FakeSGLangProxy(server.url, hide_limits=True).start()  # the client cannot know the limit
    try:
        done = extract(
            data, work / "refused", llama, "--backend", "vllm", "--url", proxy.url, "--max-length", "900"
        )
    finally:
        proxy.stop()
    assert done.returncode == 0, done.stdout + done.stderr
    rejects = [json.loads(line) for line in (work / "refused" / "rejects.jsonl").open()]
    assert [r["row"] for r in rejects] == [3] and "refused by the server (HTTP 400" in rejects[0]["reason"]
    assert sorted(rows_of(work / "refused")) == [0, 1, 2]
    assert leftovers(server.dump_root) == []


def test_a_server_capturing_other_points_is_refused_in_one_line(work, server, dataset, llama):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hsmon",
            "extract",
            str(dataset),
            "--out",
            str(work / "other"),
            "--model",
            str(llama),
            "--layers",
            "1,3,4",
            "--backend",
            "vllm",
            "--url",
            server.url,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert done.returncode == 2
    line = done.stderr.strip().splitlines()[-1]
    assert "captures points 2,4,5" in line and "hsmon vllm-serve --layers 1,3,4" in line, done.stderr
    assert leftovers(server.dump_root) == []


def test_qwen3_moe_extraction_equals_in_process(work, dataset):
    model = make_tiny_qwen3_moe(work / "tiny-qwen3-moe")
    srv = VLLMServer(model, work, layers=POINTS, dump_root=work / "dump-moe").start()
    try:
        served = extract(dataset, work / "moe-vllm", model, "--backend", "vllm", "--url", srv.url)
        assert served.returncode == 0, served.stdout + served.stderr
        assert leftovers(srv.dump_root) == []
    finally:
        srv.stop()
    assert os.listdir(srv.dump_root) == []  # vllm-serve stopped: its description goes with it
    local = extract(dataset, work / "moe-hf", model, "--device", "cpu", "--dtype", "float32")
    assert local.returncode == 0, local.stderr
    assert worst_difference(work / "moe-hf", work / "moe-vllm") <= 1e-5

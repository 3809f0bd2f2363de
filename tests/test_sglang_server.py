"""The capture plugin in a REAL SGLang server on CPU, started by `hsmon sglang-serve`.

One server for the module: the embedded target (8 layers, hidden 128) in fp32, capture points
[2, 4, 5] (SGLang ids 1, 3, 4), chunked prefill of 64 tokens so that a 200-token prompt is split
in four. Every tensor is compared with transformers' hidden states of the same model.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error

import pytest
import torch
from safetensors import safe_open

from extractor.sglang import ports
from tests.sglang_server import EMBEDDED_MODEL, ROOT, sglang_release, start_sglang_server

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

POINTS = [2, 4, 5]
CHUNK = 64
TOL = 1e-4


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("sglang-plugin")
    srv = start_sglang_server(EMBEDDED_MODEL, workdir, layers=POINTS, chunked_prefill_size=CHUNK,
                              dump_root=workdir / "dump")
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def reference():
    """transformers' (aux [seq, K*H], last [seq, H]) for a list of token ids."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(EMBEDDED_MODEL), dtype=torch.float32).eval()

    def run(ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            states = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        return torch.cat([states[p][0] for p in POINTS], dim=-1), states[-1][0]

    return run


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(3, 2048, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def request(ids, rid, hsmon=None) -> dict:
    params = {"max_new_tokens": 1}
    if hsmon is not None:
        params["custom_params"] = {"hsmon": hsmon}
    return {"input_ids": ids, "rid": rid, "return_hidden_states": True, "sampling_params": params}


def test_server_info_announces_the_plugin_and_the_capture_flags(server):
    info = server.server_info()
    assert info["hsmon_plugin_version"] == "1"
    release = sglang_release()
    # the class SGLang loaded, the ids it was given and the points it really captures (read back)
    expected = {"version": "1", "sglang_version": release["sglang_version"], "modes": ["dump", "pack"],
                "adapter": release["adapter"], "tested": True, "dump_root": str(server.dump_root),
                "model_class": "LlamaForCausalLM", "layer_ids": ",".join(str(p - 1) for p in POINTS),
                "captured_points": ",".join(map(str, POINTS))}
    if release["adapter"] == "aux-return":  # what SGLang resolved (the server runs --dtype float32); older
        expected["dtype"] = "float32"  # releases keep it out of the plugin's reach: the client uses the rule
    assert info["enable_return_hidden_states"]
    if release["adapter"] == "aux-return":  # SGLang captures the layers (0.5.23)
        assert info["return_aux_hidden_state_layer_ids"] == [p - 1 for p in POINTS]
        assert info["enable_return_aux_hidden_states"]
    else:  # layer-capture: the plugin does, and says which; SGLang runs without a draft
        assert release["adapter"] == "layer-capture"
        assert not info.get("speculative_algorithm")
    assert info["hsmon_plugin"] == expected
    assert info["disable_radix_cache"] is True and info["chunked_prefill_size"] == CHUNK
    low, high = ports.ephemeral_range()  # sglang-serve's choice, not SGLang's port-0 one
    assert not low <= info["nccl_port"] <= high


@pytest.mark.parametrize("n", [30, 200])
def test_dump_mode_writes_whole_prompts_equal_to_transformers(server, reference, n):
    ids = prompt(n, seed=n)
    job = server.dump_root / "job-a"
    meta = server.generate(request(ids, f"row-{n}", {"dump_dir": str(job)}))["meta_info"]
    marker = meta["hsmon"][0]
    file = job / f"row-{n}.safetensors"
    # the writer thread writes after the response: the marker says where, and how much
    assert marker == {"mode": "dump", "ok": True, "file": str(file),
                      "error_file": str(job / f"row-{n}.error"), "tokens": n,
                      "tensor_bytes": n * 4 * 128 * 4, "queued": True}
    assert meta["hidden_states"] == []  # nothing big over HTTP
    wait_for(file)
    assert not (job / f".row-{n}.safetensors.tmp").exists()
    assert n * 4 * 128 * 4 < file.stat().st_size < n * 4 * 128 * 4 + 1024
    aux_ref, last_ref = reference(ids)
    with safe_open(str(file), framework="pt") as fh:
        assert fh.metadata() == {"rid": f"row-{n}", "tokens": str(n), "layer_ids": "1,3,4",
                                 "captured_points": "2,4,5",
                                 "sglang_version": sglang_release()["sglang_version"], "plugin_version": "1"}
        aux, last = fh.get_tensor("aux_hidden_state"), fh.get_tensor("hidden_state")
    # n = 200 > --chunked-prefill-size 64: stock SGLang would return only the last 8 rows
    assert aux.shape == (n, 3 * 128) and last.shape == (n, 128)
    assert aux.dtype == last.dtype == torch.float32
    assert (aux - aux_ref).abs().max().item() <= TOL
    assert (last - last_ref).abs().max().item() <= TOL


def test_pack_mode_returns_captured_layers_then_the_last_layer(server, reference):
    ids = prompt(50, seed=1)
    meta = server.generate(request(ids, "pack-50", {"pack_last": True}))["meta_info"]
    assert meta["hsmon"] == [{"mode": "pack", "ok": True, "rows": 50, "width": 4 * 128}]
    packed = torch.tensor(meta["hidden_states"][0])
    aux_ref, last_ref = reference(ids)
    assert packed.shape == (50, 4 * 128)
    assert (packed - torch.cat([aux_ref, last_ref], dim=-1)).abs().max().item() <= TOL


def test_pack_mode_keeps_every_chunked_prefill_piece(server, reference):
    # Stock SGLang returns only the last piece (200 - 3 * 64 rows); pack mode the whole row.
    ids = prompt(200, seed=2)
    meta = server.generate(request(ids, "pack-200", {"pack_last": True}))["meta_info"]
    assert meta["hsmon"][0] == {"mode": "pack", "ok": True, "rows": 200, "width": 4 * 128}
    packed = torch.tensor(meta["hidden_states"][0])
    aux_ref, last_ref = reference(ids)
    assert (packed - torch.cat([aux_ref, last_ref], dim=-1)).abs().max().item() <= TOL


def test_server_info_counts_the_hook_and_the_writer(server):
    before = capture_state(server)
    assert before["pool_limit_bytes"] > 0 and before["sync_fallbacks"] == 0
    job = server.dump_root / "job-c"
    server.generate(request(prompt(100, seed=9), "count-1", {"dump_dir": str(job)}))
    wait_for(job / "count-1.safetensors")
    after = capture_state(server)
    assert after["requests"] == before["requests"] + 1
    assert after["files_written"] == before["files_written"] + 1 and after["write_seconds"] > 0
    assert after["queue_depth"] == 0 and after["pool_bytes_in_use"] == 0
    path, hook_ms, mb, cpu_ms = after["hook_samples"][-1]
    assert path == "async" and hook_ms > 0 and mb == round(100 * 4 * 128 * 4 / 1e6, 4)
    assert 0 < cpu_ms <= hook_ms + 0.01  # the hook thread's CPU time is part of its wall time


def test_rows_held_as_views_across_interleaved_forwards_are_right(server, reference):
    # On CPU the plugin holds views of each forward's output (no copy on the hook) until its
    # writer thread writes the file. Four multi-chunk dumps in flight at once share batches and
    # each holds rows of earlier forwards while later forwards run: every file must equal
    # transformers (it would hold a later forward's rows were SGLang to reuse its buffers).
    from concurrent.futures import ThreadPoolExecutor

    job = server.dump_root / "job-v"
    rows = {f"view-{n}": prompt(n, seed=100 + n) for n in (150, 190, 97, 230)}
    with ThreadPoolExecutor(len(rows)) as pool:
        metas = list(pool.map(
            lambda item: server.generate(request(item[1], item[0], {"dump_dir": str(job)}))["meta_info"],
            rows.items()))
    assert all(m["hsmon"][0]["ok"] for m in metas), metas
    for rid, ids in rows.items():
        wait_for(job / f"{rid}.safetensors")
        aux_ref, last_ref = reference(ids)
        with safe_open(str(job / f"{rid}.safetensors"), framework="pt") as fh:
            assert (fh.get_tensor("aux_hidden_state") - aux_ref).abs().max().item() <= TOL, rid
            assert (fh.get_tensor("hidden_state") - last_ref).abs().max().item() <= TOL, rid
    deadline = time.monotonic() + 30  # the writer frees the pool just after the last rename
    while (state := capture_state(server))["pool_bytes_in_use"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert state["buffer_reuses"] == 0 and state["pool_bytes_in_use"] == 0


def capture_state(server) -> dict:
    (state,) = server.server_info()["internal_states"]
    return state["hsmon_capture"]


def wait_for(path, timeout: float = 60.0) -> None:
    """The plugin's writer thread renames the file after the response."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} not written within {timeout} s"
        time.sleep(0.01)


def test_requests_without_opt_in_are_stock(server, reference):
    ids = prompt(40, seed=3)
    before = sorted(server.dump_root.rglob("*"))
    meta = server.generate(request(ids, "plain-40"))["meta_info"]
    assert "hsmon" not in meta
    stock = torch.tensor(meta["hidden_states"][0])
    aux_ref, _ = reference(ids)
    assert stock.shape == (40, 3 * 128)  # stock aux capture: the captured layers only
    assert (stock - aux_ref).abs().max().item() <= TOL
    # and an opted-in request in the same batch does not change its neighbour's answer
    both = server.generate({
        "input_ids": [ids, ids], "rid": ["plain-b", "dump-b"], "return_hidden_states": True,
        "sampling_params": [{"max_new_tokens": 1},
                            {"max_new_tokens": 1,
                             "custom_params": {"hsmon": {"dump_dir": str(server.dump_root / "job-b")}}}],
    })
    assert "hsmon" not in both[0]["meta_info"] and both[1]["meta_info"]["hsmon"][0]["ok"] is True
    assert torch.equal(torch.tensor(both[0]["meta_info"]["hidden_states"][0]), stock)
    wait_for(server.dump_root / "job-b" / "dump-b.safetensors")
    assert sorted(server.dump_root.rglob("*")) == sorted(
        [*before, server.dump_root / "job-b", server.dump_root / "job-b" / "dump-b.safetensors"]
    )


def test_refused_dumps_complete_the_request_and_say_why(server, tmp_path):
    ids = prompt(20, seed=4)
    outside = server.generate(request(ids, "out-1", {"dump_dir": str(tmp_path)}))
    marker = outside["meta_info"]["hsmon"][0]
    assert marker["ok"] is False and "outside the server's dump root" in marker["error"]
    assert outside["meta_info"]["finish_reason"] is not None and list(tmp_path.iterdir()) == []
    bad_rid = server.generate(request(ids, "../etc", {"dump_dir": str(server.dump_root / "j")}))
    assert "cannot name a dump file" in bad_rid["meta_info"]["hsmon"][0]["error"]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_full_dump_dir_fails_the_dump_not_the_request(server):
    full = server.dump_root / "full"
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(full)], check=True)
    try:
        big = server.generate(request(prompt(200, seed=5), "big-1", {"dump_dir": str(full / "job")}))
        assert big["meta_info"]["hsmon"][0]["queued"] is True  # the failure comes later, as a file
        error = full / "job" / "big-1.error"
        wait_for(error)
        info = json.loads(error.read_text())
        assert info["errno"] == "ENOSPC" and "big-1.safetensors" in info["error"], info
        assert len(error.read_text().splitlines()) == 1
        assert [p.name for p in (full / "job").iterdir()] == ["big-1.error"]  # no partial file, no .tmp
        # the server still serves, and the same dump dir works for a row that fits
        small = server.generate(request(prompt(10, seed=6), "small-1", {"dump_dir": str(full / "job")}))
        assert small["meta_info"]["hsmon"][0]["ok"] is True
        wait_for(full / "job" / "small-1.safetensors")
    finally:
        subprocess.run(["umount", str(full)], check=True)


def test_sglang_serve_refuses_bad_layers_with_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "hsmon", "sglang-serve", "--model-path", str(EMBEDDED_MODEL),
         "--layers", "2,8"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "hsmon sglang-serve: --layers '2,8': capture points must be distinct and lie in 1..7 for this "
        "8-layer model (the last layer is always returned after the norm)"
    ]


def test_a_retry_after_a_client_timeout_mid_prefill_writes_one_whole_file(server, reference):
    # The client gives up during a many-chunk prefill (SGLang aborts the request on disconnect),
    # then retries with the same rid, as `hsmon extract` does: the file must hold exactly the
    # prompt's rows, with nothing left over from the aborted attempt's buffered chunks.
    ids = prompt(1500, seed=8)  # 24 chunks of 64
    body = request(ids, "retry-1", {"dump_dir": str(server.dump_root / "job-r")})
    with pytest.raises(TimeoutError):
        server.generate(body, timeout=0.2)
    deadline = time.monotonic() + 180
    while True:  # until SGLang has finished aborting the first attempt
        try:
            meta = server.generate(body, timeout=180)["meta_info"]
            break
        except urllib.error.HTTPError as exc:
            assert exc.code == 400 and "Duplicate request ID" in exc.read().decode(), exc
            assert time.monotonic() < deadline
            time.sleep(0.2)
    marker = meta["hsmon"][0]
    assert marker["ok"] is True and marker["tokens"] == 1500, marker
    wait_for(server.dump_root / "job-r" / "retry-1.safetensors")
    aux_ref, last_ref = reference(ids)
    with safe_open(marker["file"], framework="pt") as fh:
        assert (fh.get_tensor("aux_hidden_state") - aux_ref).abs().max().item() <= TOL
        assert (fh.get_tensor("hidden_state") - last_ref).abs().max().item() <= TOL
    assert sorted(p.name for p in (server.dump_root / "job-r").iterdir()) == ["retry-1.safetensors"]


def test_sigterm_to_sglang_serve_stops_the_whole_server(server):
    # Last in the module: it ends the module's server (the fixture's stop() is then a no-op).
    import psutil

    group = [p for p in psutil.process_iter(["pid"]) if _pgid(p.pid) == server.proc.pid]
    assert len(group) >= 4  # sglang-serve, SGLang's main process, its scheduler and detokenizer
    server.proc.send_signal(signal.SIGTERM)  # sglang-serve alone, as systemd or a shell would
    status = server.proc.wait(timeout=60)
    # SGLang 0.5.18's SIGTERM path ends in kill_process_tree(os.getpid(), include_parent=True)
    # (sglang/srt/managers/tokenizer_manager.py:3157): its main process SIGKILLs itself once the
    # schedulers have shut down, and sglang-serve passes that status on; 0.5.23 exits by itself.
    self_killing = sglang_release()["sglang_version"] in ("0.5.18",)
    assert status in (0, 128 + signal.SIGTERM, *((128 + signal.SIGKILL,) if self_killing else ())), \
        server.tail()
    assert "ready at" in server.tail(400)
    _gone, alive = psutil.wait_procs(group, timeout=30)
    assert alive == []


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None

"""What needs no vLLM server (make test): vLLM's layer rule beside SGLang's, `hsmon vllm-serve`'s and
`hsmon extract --backend vllm`'s refusals in one line, the capture flags it gives vLLM (its own
connector on a GPU node, the test device on CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from extractor.vllm.serve import CPU_CONNECTOR, STOCK_CONNECTOR, capture_args
from hsmon.contracts.engines import capture_record, vllm_layer_ids

ROOT = Path(__file__).resolve().parents[1]


def hsmon(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hsmon", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_the_engines_name_the_same_points_by_other_ids():
    sglang = capture_record([2, 4, 5], "sglang", "LlamaForCausalLM", 8)
    vllm = capture_record([2, 4, 5], "vllm", "LlamaForCausalLM", 8)
    assert sglang["layer_ids"] == [1, 3, 4] and sglang["rule"] == "llama"
    assert vllm["layer_ids"] == [2, 4, 5] and vllm["rule"] == "vllm" and vllm["engine"] == "vllm"
    assert capture_record([2, 30, 58], "sglang", "DeepseekV3ForCausalLM", 61)["layer_ids"] == [1, 29, 57]
    with pytest.raises(ValueError, match="ascending"):
        vllm_layer_ids([5, 2, 4])


def test_capture_flags_name_the_points_the_last_layer_and_the_connector():
    cpu = capture_args([2, 4, 5], 7, "/dev/shm/x", cpu=True)
    gpu = capture_args([2, 4, 5], 7, "/dev/shm/x", cpu=False)
    spec = json.loads(cpu[cpu.index("--speculative-config") + 1])
    assert spec["method"] == "extract_hidden_states"
    assert spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5, 7]
    cpu_kv = json.loads(cpu[cpu.index("--kv-transfer-config") + 1])
    gpu_kv = json.loads(gpu[gpu.index("--kv-transfer-config") + 1])
    assert cpu_kv["kv_connector"] == CPU_CONNECTOR and cpu_kv["kv_connector_module_path"]
    assert gpu_kv["kv_connector"] == STOCK_CONNECTOR and "kv_connector_module_path" not in gpu_kv
    assert cpu_kv["kv_connector_extra_config"]["shared_storage_path"] == "/dev/shm/x"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--layers", "5,2,4"], "vLLM captures layers in ascending order"),
        (["--layers", "2,4,9"], "capture points must be distinct and lie in 1..7"),
        (["--python", "/nonexistent/python"], "--python /nonexistent/python does not exist (make vllm-env"),
        (["--", "--port", "9"], "--port after -- conflicts with what vllm-serve sets"),
        (
            ["--", "--enable-prefix-caching"],
            "--enable-prefix-caching after --: a capture server computes every",
        ),
        (["--draft", "/nonexistent-drafter"], "--draft /nonexistent-drafter: cannot read config.json"),
    ],
)
def test_vllm_serve_refuses_bad_input_in_one_line(args, expected, tmp_path):
    done = hsmon("vllm-serve", "--model-path", "embedded", "--dump-dir", str(tmp_path / "d"), *args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hsmon vllm-serve: ") and expected in lines[0], done.stderr
    assert not (tmp_path / "d").exists()  # refused before anything was written or started


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--backend", "vllm"], "--backend vllm needs --url http://HOST:PORT"),
        (
            ["--backend", "vllm", "--url", "http://127.0.0.1:9", "--transport", "json"],
            "--transport belongs to --backend sglang (SGLang servers) but this run uses --backend vllm",
        ),
        (
            ["--url", "http://127.0.0.1:9"],
            "--url belongs to --backend sglang (SGLang servers) or --backend vllm",
        ),
    ],
)
def test_extract_backend_vllm_refuses_bad_options_in_one_line(args, expected, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"text": "hello"}\n')
    done = hsmon("extract", str(data), "--out", str(tmp_path / "out"), *args)
    assert done.returncode == 2, done.stderr
    assert expected in done.stderr.strip().splitlines()[-1], done.stderr


def test_the_engines_layer_rules_in_the_docs_are_rendered_from_the_committed_contracts():
    """docs/vllm.md's table of both engines' rules is what the contracts derived from each engine's code
    render (hsmon/contracts/sglang_classes.py, hsmon/contracts/vllm_classes.py); the lane checks the
    vLLM contract against vLLM's code itself."""
    from extractor.vllm import rule_table
    from hsmon.contracts import vllm_classes

    assert rule_table.main(["--docs", "--check"]) == 0, "run python -m extractor.vllm.rule_table --docs"
    assert (
        vllm_classes.DECODER_RULES["llama.LlamaModel"]
        == vllm_classes.DECODER_RULES["qwen3_moe.Qwen3MoeModel"]
        == "vllm"
    )  # the decoders whose capture test_extract_vllm measures


def test_vllm_serve_refuses_a_class_that_vllm_cannot_capture_from(tmp_path):
    model = tmp_path / "gpt2-like"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps({"architectures": ["GPT2LMHeadModel"], "num_hidden_layers": 8})
    )
    done = hsmon("vllm-serve", "--model-path", str(model), "--dump-dir", str(tmp_path / "d"))
    assert done.returncode == 2
    line = done.stderr.strip()
    assert "GPT2LMHeadModel does not capture layers for EAGLE-3" in line and "\n" not in line, done.stderr

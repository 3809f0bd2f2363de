"""SGLang's own EAGLE-3 loader run on an export, in .sglang-venv (`make sglang-env` builds it)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SGLANG_PYTHON = ROOT / ".sglang-venv" / "bin" / "python"


def sglang_python() -> Path:
    """The SGLang environment's interpreter; a skip without it (a failure under HSMON_REQUIRE_SGLANG)."""
    if not SGLANG_PYTHON.exists():
        if os.environ.get("HSMON_REQUIRE_SGLANG"):
            raise AssertionError(f"{SGLANG_PYTHON} missing: run `make sglang-env`")
        pytest.skip("no .sglang-venv (make sglang-env builds it)")
    return SGLANG_PYTHON


def assert_sglang_loads_export(export: Path) -> dict:
    """SGLang's `LlamaForCausalLMEagle3.load_weights` takes every tensor of ``export`` exactly once,
    writes every parameter but the shared embedding, and builds its hot-token map from d2t equal
    to the draft vocabulary. Returns the loader's report."""
    from safetensors.torch import load_file

    python = sglang_python()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests" / "sglang_stubs"), "SGLANG_USE_CPU_ENGINE": "1"}
    proc = subprocess.run(
        [str(python), str(ROOT / "tests" / "sglang_checks" / "load_eagle3_export.py"), str(export)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["sglang_class"] == "sglang.srt.models.llama_eagle3.LlamaForCausalLMEagle3"
    tensors = load_file(export / "model.safetensors")
    params = report["params"]
    fills: dict[str, int] = {}
    for name, shape in report["tensors"].items():
        received = report["received"][name]
        if name in ("d2t", "t2d"):
            continue  # d2t becomes the hot-token map (checked below); SGLang ignores t2d by design
        assert len(received) == 1, f"{name} was loaded {len(received)} times: {received}"
        param, shard = received[0]
        if shard:  # a slice of a fused parameter (qkv, gate_up): rows add up below
            fills[param] = fills.get(param, 0) + shape[0]
            assert params[param][1:] == shape[1:], (name, param)
        elif param == "lm_head.weight":  # SGLang pads the vocabulary dimension
            assert params[param][1] == shape[1] and params[param][0] >= shape[0]
        else:
            assert params[param] == shape, (name, param)
    for param, rows in fills.items():
        assert params[param][0] == rows, f"{param}: shards filled {rows} of {params[param][0]} rows"
    # every parameter was written except the embedding, which SGLang shares from the target
    assert report["unwritten"] == ["model.embed_tokens.weight"]
    expected_hot = (tensors["d2t"] + torch.arange(tensors["d2t"].shape[0])).tolist()
    assert report["hot_token_id"] == expected_hot == tensors["t2d"].nonzero().flatten().tolist()
    assert report["fc_weight"] == tensors["fc.weight"].float().flatten()[:8].tolist()
    return report


def sglang_draft_logits(runs: list[tuple[Path, dict[str, torch.Tensor]]],
                        work: Path) -> list[list[torch.Tensor]]:
    """For each (export, inputs): SGLang's own LlamaForCausalLMEagle3 loaded from the export
    drafts (one process for all): a draft extend over ``aux`` [T, K*H] with ``ids[:T]``, then
    decode steps at the last position with the rest of ``ids``; ``embed`` is the target's
    embedding. Returns each run's logits per step ([T, V], then [1, V] each)."""
    from safetensors.torch import load_file, save_file

    python = sglang_python()
    argv = []
    for n, (export, inputs) in enumerate(runs):
        save_file({k: v.contiguous() for k, v in inputs.items()}, str(work / f"inputs{n}.safetensors"))
        argv += [str(export), str(work / f"inputs{n}.safetensors"), str(work / f"logits{n}.safetensors")]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests" / "sglang_stubs"), "SGLANG_USE_CPU_ENGINE": "1"}
    proc = subprocess.run(
        [str(python), str(ROOT / "tests" / "sglang_checks" / "forward_eagle3_export.py"), *argv],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = []
    for n in range(len(runs)):
        out = load_file(work / f"logits{n}.safetensors")
        results.append([out[f"logits_{i}"] for i in range(len(out))])
    return results

"""Real vLLM servers on CPU for tests, started through `hsmon vllm-serve`, and tiny targets made
independently of the project (transformers' own configs, random weights, the embedded tokenizer).

A missing .vllm-venv skips, or fails under HSMON_REQUIRE_VLLM=1 (as `make test-vllm` sets); the tests
that need it are marked ``vllm`` and run in that lane only (`make test` deselects them: -m "not vllm").
The server runs in its own process group; stop()/kill() end the whole group.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sglang_server import SGLangServer

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = Path(os.environ.get("HSMON_VLLM_VENV") or ROOT / ".vllm-venv") / "bin" / "python"
EMBEDDED_TOKENIZER = ROOT / "extractor" / "embedded"
READY_TIMEOUT = 420.0
# vLLM's own flags for every test server: float32 (the equality bars), eager (no torch.compile warm-up:
# ~25 s to ready instead of ~75 s), short contexts (a small KV cache on the shared machine).
TEST_ARGS = ("--dtype", "float32", "--enforce-eager", "--max-model-len", "1024")
TEST_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}


def vllm_python() -> Path:
    """vLLM's environment's Python, or skip (fail under HSMON_REQUIRE_VLLM=1)."""
    if not VLLM_PYTHON.exists():
        if os.environ.get("HSMON_REQUIRE_VLLM"):
            raise AssertionError(f"{VLLM_PYTHON} missing: run `make vllm-env`")
        pytest.skip("no .vllm-venv (make vllm-env builds it)")
    return VLLM_PYTHON


def _tokenizer_into(out: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(EMBEDDED_TOKENIZER / name, out / name)


def make_tiny_llama(out: Path, layers: int = 7, seed: int = 1234) -> Path:
    """A dense Llama built here with transformers' LlamaConfig and random weights (head_dim 32: vLLM's
    CPU attention has no kernel for 16)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=2048,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
        dtype="float32",
    )
    LlamaForCausalLM(config).eval().save_pretrained(out)
    _tokenizer_into(out)
    return out


def make_tiny_qwen3_moe(out: Path, seed: int = 7) -> Path:
    """A Qwen3-MoE (every layer MoE, q/k norms) built here with transformers' Qwen3MoeConfig."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    config = Qwen3MoeConfig(
        vocab_size=2048,
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        norm_topk_prob=True,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
        dtype="float32",
    )
    Qwen3MoeForCausalLM(config).eval().save_pretrained(out)
    _tokenizer_into(out)
    return out


def shared_llama_server(tmp_path_factory):
    """The session's tiny-Llama capture server (tests/conftest.py's ``vllm_llama_server``): points 2,4,5,
    a 512-token context (a longer row is the server's to refuse), its own dump directory."""
    vllm_python()
    work = tmp_path_factory.mktemp("vllm-llama")
    server = VLLMServer(
        make_tiny_llama(work / "tiny-llama"),
        work,
        layers=[2, 4, 5],
        dump_root=work / "dump",
        extra_args=("--max-model-len", "512"),
    ).start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class VLLMServer(SGLangServer):
    """One `hsmon vllm-serve` process (and vLLM's processes under it) on a port: the SGLang test server's
    process handling (launch, ready, stop, kill, in a process group of its own) with vllm-serve's
    command and vLLM's test settings."""

    program = "vllm-serve"
    env: Mapping[str, str] = field(default_factory=lambda: dict(TEST_ENV))

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "hsmon", "vllm-serve", "--model-path", str(self.model_dir),
               "--port", str(self.port), "--python", str(vllm_python()), "--device", "cpu"]
        if self.layers:
            cmd += ["--layers", ",".join(str(p) for p in self.layers)]
        if self.dump_root is not None:
            cmd += ["--dump-dir", str(self.dump_root)]
        return [*cmd, *self.serve_args, "--", *TEST_ARGS, *self.extra_args]

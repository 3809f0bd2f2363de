"""Run in vLLM's environment: the layer ids vLLM's own config path gives the target for a drafter.

``python -m tests.vllm_checks.config_probe TARGET DRAFT [DRAFT ...]`` builds vLLM's ``SpeculativeConfig``
(method eagle3, the drafter directory as vLLM loads it) and asks the model runner's own
``_get_eagle3_aux_layers_from_config`` which layer ids it hands the target's
``set_aux_hidden_state_layers``; prints one JSON list per drafter (the last line: a list of them).
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace


def main(target: str, drafts: list[str]) -> list[list[int]]:
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    target_config = ModelConfig(model=target, dtype="float32", max_model_len=512)
    found = []
    for draft in drafts:
        spec = SpeculativeConfig(method="eagle3", model=draft, num_speculative_tokens=3,
                                 target_model_config=target_config, target_parallel_config=ParallelConfig())
        runner = SimpleNamespace(speculative_config=spec)
        found.append(list(GPUModelRunner._get_eagle3_aux_layers_from_config(runner) or []))
    return found


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2:])))

"""Runs inside .sglang-venv: builds SGLang's own EAGLE-3 draft model on CPU and loads an export.

usage: python load_eagle3_export.py EXPORT_DIR
Prints one JSON object: what SGLang's ``LlamaForCausalLMEagle3.load_weights`` did with every
exported tensor (which parameter and shard received it), the parameters it left unwritten, and
the hot-token map it built from d2t. Exits non-zero only when SGLang itself raises.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: its stdlib-only port helper
from extractor.sglang.ports import free_stable_port


def sglang_draft_model(export_dir: str, set_up: bool = True):
    """(sglang.srt.models.llama_eagle3, its LlamaForCausalLMEagle3 built from ``export_dir``'s
    config.json on CPU in float32, weights not loaded), after SGLang's single-process set-up
    (done once per process: ``set_up=False`` for a further model)."""
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    import sglang.srt.models.llama_eagle3 as eagle3
    from sglang.srt.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs
    from transformers import AutoConfig

    if not set_up:
        return eagle3, eagle3.LlamaForCausalLMEagle3(AutoConfig.from_pretrained(export_dir))
    args = ServerArgs(
        model_path=export_dir,
        device="cpu",
        attention_backend="torch_native",
        dtype="float32",
        skip_tokenizer_init=True,
    )
    publish(args, role="test", ranks=SpawnRanks(world_rank=0))
    init_distributed_environment(
        world_size=1,
        rank=0,
        local_rank=0,
        backend="gloo",
        distributed_init_method=f"tcp://127.0.0.1:{free_stable_port()}",
    )
    initialize_model_parallel()

    config = AutoConfig.from_pretrained(export_dir)
    torch.set_default_dtype(torch.float32)
    return eagle3, eagle3.LlamaForCausalLMEagle3(config)


def main(export_dir: str) -> int:
    from safetensors.torch import load_file

    eagle3, model = sglang_draft_model(export_dir)
    params = dict(model.named_parameters())
    for param in params.values():
        param.data.fill_(float("nan"))  # so that an unwritten parameter shows

    tensors = load_file(os.path.join(export_dir, "model.safetensors"))
    names_by_id = {id(t): name for name, t in tensors.items()}
    received: dict[str, list[list]] = {name: [] for name in tensors}

    def recording(param_name: str, loader):
        def load(param, loaded_weight, *shard):
            source = names_by_id.get(id(loaded_weight), "?")
            received.setdefault(source, []).append([param_name, list(shard)])
            return loader(param, loaded_weight, *shard)

        return load

    for name, param in params.items():
        if hasattr(param, "weight_loader"):
            param.weight_loader = recording(name, param.weight_loader)
    original_default = eagle3.default_weight_loader
    param_names = {id(p): n for n, p in params.items()}

    def default_loader(param, loaded_weight, *shard):
        return recording(param_names.get(id(param), "?"), original_default)(param, loaded_weight, *shard)

    eagle3.default_weight_loader = default_loader
    model.load_weights(iter(tensors.items()))

    cls = eagle3.LlamaForCausalLMEagle3
    unwritten = [n for n, p in params.items() if torch.isnan(p.data).any()]
    hot = model.get_hot_token_id()
    print(
        json.dumps(
            {
                "tensors": {n: list(t.shape) for n, t in tensors.items()},
                "received": received,
                "params": {n: list(p.shape) for n, p in params.items()},
                "unwritten": unwritten,
                "hot_token_id": hot.tolist() if hot is not None else None,
                "fc_weight": model.model.fc.weight.detach().flatten()[:8].tolist(),
                "sglang_class": f"{cls.__module__}.{cls.__name__}",
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))

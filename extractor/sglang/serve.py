"""`hsmon sglang-serve`: start SGLang with the capture flags and hsmon's capture plugin.

Runs in hsmon's environment but never imports sglang (nor torch): it launches
``PYTHON -m sglang.launch_server`` in SGLang's own environment, with the plugin directory on
``PYTHONPATH`` (the plugin package and its ``*.dist-info`` whose entry point SGLang's plugin
loader finds), waits until the server answers, prints its URL, forwards SIGTERM/SIGINT and exits
with the server's status.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from extractor.sglang.cpu_binding import bind_env
from extractor.sglang.layer_ids import LayerIdsError, serving_ids
from extractor.sglang.ports import free_stable_port
from extractor.sglang.speculative import DEFAULT_DRAFT_TOKENS, DraftError, SpecPlan, plan
from extractor.sglang.supervise import supervise
from extractor.targets import ModelUnavailable, resolve_model
from hsmon.contracts.capture_points import parse_capture_points
from hsmon.contracts.port_holder import port_refusal
from hsmon.contracts.units import port_number

PACKAGE_DIR = Path(__file__).resolve().parent
PLUGIN_ROOT = PACKAGE_DIR / "plugin_root"
REPO_ROOT = PACKAGE_DIR.parent.parent
# sgl-kernel has no CPU wheel; a source checkout carries a stand-in (see tests/sglang_stubs).
CPU_STUBS = REPO_ROOT / "tests" / "sglang_stubs"
PLUGIN_NAME = "hsmon_capture"
DEFAULT_DUMP_ROOT = "/dev/shm/hsmon"
CPU_MAX_TOTAL_TOKENS = "8192"
# The plugin's adapters (extractor/sglang/plugin_root/hsmon_sglang_plugin/features.py).
AUX_RETURN = "aux-return"
LAYER_CAPTURE = "layer-capture"
WHOLE_PREFILL = "whole-prefill"  # layer-capture with chunked prefill off (SGLang 0.5.14)


class ServeError(ValueError):
    """Bad options: one line naming the input and the fix."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-path", required=True,
                        help="the target model: a Hugging Face directory or a preset name (embedded, "
                        "smollm2), as every model option takes")
    parser.add_argument(
        "--dump-dir",
        default=DEFAULT_DUMP_ROOT,
        help=f"root the plugin may write request dumps under (default {DEFAULT_DUMP_ROOT}); "
        "clients use a subdirectory per job",
    )
    parser.add_argument(
        "--layers",
        help="capture points, hsmon's convention (transformers' hidden_states[p]; the SGLang layer ids "
        "follow the model class's rule); default EAGLE-3's [2, N//2, N-3] from config.json",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=port_number, default=30000, help="port, 0-65535 (default 30000)")
    parser.add_argument(
        "--python",
        help="the Python of SGLang's environment (default: the repository's .sglang-venv if present, "
        "else `python`)",
    )
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="auto: cuda when an NVIDIA device node is present, else cpu (adds SGLang's CPU flags)",
    )
    parser.add_argument(
        "--ready-timeout",
        type=float,
        default=0,
        help="give up (and stop the server) when it is not ready after this many seconds; 0 = wait",
    )
    parser.add_argument(
        "--allow-untested-sglang",
        action="store_true",
        help="start an SGLang release outside the tested set (docs/extract.md's support table); "
        "then check the first dumps with hsmon verify-data",
    )
    parser.add_argument("--draft", metavar="DIR",
                        help="serve with EAGLE speculative decoding from this drafter (the directory of "
                        "hsmon export-drafter): a chain of --draft-tokens tokens per verify, no capture "
                        "flags; SGLang's own --speculative-* flags after -- are kept (docs/serve-drafter.md)")
    parser.add_argument("--draft-tokens", type=int, default=DEFAULT_DRAFT_TOKENS, metavar="N",
                        help=f"with --draft: tokens per verify, the verified one included (default "
                        f"{DEFAULT_DRAFT_TOKENS}: 3 drafted)")
    parser.add_argument("--no-metrics", action="store_true", help="leave SGLang's /metrics off (by default "
                        "--enable-metrics is passed: the daemon reads the server's load from it)")
    parser.add_argument(
        "sglang_args",
        nargs=argparse.REMAINDER,
        help="after --: more arguments for sglang.launch_server (e.g. -- --dtype float32 --tp-size 2)",
    )


def parse_layers(text: str | None, model_path: Path) -> list[int]:
    """Capture points from ``--layers`` or config.json; ServeError on bad input."""
    config_file = model_path / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise ServeError(
            f"--model-path {model_path}: cannot read config.json ({exc}); pass a model directory"
        ) from None
    config = config.get("text_config", config)
    num_layers = int(config.get("num_hidden_layers", 0))
    if not num_layers:
        raise ServeError(f"{config_file} has no num_hidden_layers; is this a causal-LM directory?")
    try:
        return parse_capture_points(text, num_layers)
    except ValueError as exc:
        raise ServeError(str(exc)) from None


def python_named(python: str, default: bool = False) -> str:
    """The Python as tried: where a bare name was found on PATH, and why this one (``default``: no
    --python given and no .sglang-venv in the checkout)."""
    found = shutil.which(python) if os.sep not in python else None
    why = ", the default without .sglang-venv in this checkout" if default else ""
    return f"{python} ({found}{why})" if found else python


def sglang_python(explicit: str | None) -> str:
    if explicit:
        return explicit
    venv = REPO_ROOT / ".sglang-venv" / "bin" / "python"
    return str(venv) if venv.exists() else "python"


def on_cpu(device: str) -> bool:
    if device != "auto":
        return device == "cpu"
    return not (Path("/dev/nvidiactl").exists() or Path("/dev/nvidia0").exists())


def _given(args: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def _value(args: list[str], flag: str) -> str | None:
    """The value given to ``flag`` (``--flag V`` or ``--flag=V``; the last one counts), or None."""
    found = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith(flag + "="):
            found = arg.split("=", 1)[1]
    return found


def dp_attention_refusal(extra: list[str]) -> str | None:
    """One line refusing DP attention among SGLang's arguments (``--enable-dp-attention``, or
    ``--attn-dp-size N`` over 1, its spelling from 0.5.22 on), or None."""
    size = _value(extra, "--attn-dp-size")
    if _given(extra, "--enable-dp-attention"):
        given = "--enable-dp-attention"
    elif size is not None and size.strip() not in ("", "1"):
        given = f"--attn-dp-size {size}"
    else:
        return None
    return (f"{given} (DP attention) is not supported by the capture plugin (untested: its writing rank "
            "is chosen per attention-TP group); use --tp-size, or --dp-size without DP attention")


def build_command(
    python: str,
    model_path: str,
    capture_points: list[int],
    host: str,
    port: int,
    cpu: bool,
    extra: list[str],
    adapter: str = AUX_RETURN,
    nccl_port: int | None = None,
    layer_ids: list[int] | None = None,
    metrics: bool = True,
    speculative: SpecPlan = SpecPlan(),
) -> list[str]:
    """The ``sglang.launch_server`` command line with the extraction flags: SGLang's own aux
    capture for adapter ``aux-return``; for ``layer-capture`` the plugin captures the layers
    (``HSMON_PLUGIN_AUX_LAYER_IDS``, see ``build_env``) and SGLang returns the last layer.
    ``nccl_port``: SGLang's ``--nccl-port`` unless ``extra`` names one (see extractor/sglang/ports.py).
    ``layer_ids``: the ids for ``capture_points`` by the class's rule (``serving_ids``; default ``p - 1``).
    ``speculative``: a serving server's speculative flags (extractor/sglang/speculative.py), in place
    of the capture flags."""
    ids = layer_ids if layer_ids is not None else [p - 1 for p in capture_points]
    cmd = [python, "-m", "sglang.launch_server", "--model-path", model_path]
    cmd += ["--host", host, "--port", str(port)]
    if speculative.active:
        cmd += list(speculative.args)
    else:
        cmd += ["--enable-return-hidden-states"]
    if adapter == AUX_RETURN and not speculative.active:
        cmd += [
            "--enable-return-aux-hidden-states",
            "--speculative-algorithm",
            "EAGLE3",
            "--return-aux-hidden-state-layer-ids",
            *[str(i) for i in ids],
        ]
    cmd += ["--disable-radix-cache"]
    if cpu:
        cmd += ["--device", "cpu"]
        if not _given(extra, "--attention-backend"):
            cmd += ["--attention-backend", "torch_native"]
        if not _given(extra, "--max-total-tokens"):
            cmd += ["--max-total-tokens", CPU_MAX_TOTAL_TOKENS]
    if nccl_port is not None and not _given(extra, "--nccl-port"):
        cmd += ["--nccl-port", str(nccl_port)]
    if metrics and not _given(extra, "--enable-metrics"):
        cmd += ["--enable-metrics"]  # the server's load figures for the daemon (running, queued, tok/s)
    return cmd + extra


def build_env(base: dict[str, str], dump_root: str, cpu: bool) -> dict[str, str]:
    """SGLang's environment: the plugin on PYTHONPATH (first), its dump root, the CPU engine."""
    env = dict(base)
    paths = [str(PLUGIN_ROOT)]
    if cpu:
        env["SGLANG_USE_CPU_ENGINE"] = "1"
        if CPU_STUBS.is_dir():
            paths.append(str(CPU_STUBS))
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["HSMON_PLUGIN_DUMP_ROOT"] = dump_root
    allowed = env.get("SGLANG_PLUGINS")
    if allowed and PLUGIN_NAME not in {x.strip() for x in allowed.split(",")}:
        env["SGLANG_PLUGINS"] = f"{allowed},{PLUGIN_NAME}"
    return env


def probe(python: str, env: dict[str, str]) -> dict:
    """The SGLang release and capture adapter of ``python``'s environment (the plugin's
    ``features.py``, run there: it reads SGLang's files without importing it)."""
    try:
        out = subprocess.run([python, "-m", "hsmon_sglang_plugin.features"], env=env, capture_output=True,
                             text=True, timeout=60, check=True).stdout
        return json.loads(out.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        raise ServeError(f"--python {python}: cannot read its SGLang's features ({exc}); "
                         f"pass the Python of an SGLang environment: {INSTALL_HINT}") from exc


INSTALL_HINT = ("make sglang-env builds a CPU one in this checkout (.sglang-venv); on a GPU node: python -m "
                "venv /opt/sglang && /opt/sglang/bin/pip install 'sglang[all]' (docs/operations.md)")


def check_release(found: dict, allow_untested: bool, python: str = "python") -> str | None:
    """The one-line refusal for the probed SGLang, or None."""
    if found.get("sglang_version") == "none" and found.get("refusal"):  # no SGLang at all in that Python
        return f"--python {python}: {found['refusal']}; {INSTALL_HINT}, then pass --python DIR/bin/python"
    if found.get("refusal"):
        return str(found["refusal"])
    if not found.get("tested") and not allow_untested:
        return (f"SGLang {found.get('sglang_version')} is outside the tested releases (docs/extract.md, "
                "\"Supported SGLang releases\"); install one, or pass --allow-untested-sglang and check "
                "the first dumps with hsmon verify-data")
    return None


def plain_launch_line(cmd: list[str], env: dict[str, str], base: dict[str, str]) -> str:
    """The equivalent shell line (what changed in the environment, then the command)."""
    changed = [f"{k}={env[k]}" for k in sorted(env) if base.get(k) != env[k]]
    return " ".join([*changed, *cmd])


def run(args: argparse.Namespace) -> int:
    extra = list(args.sglang_args or [])
    if extra and extra[0] == "--":
        extra = extra[1:]
    try:
        model_path = resolve_model(args.model_path, "--model-path")  # a directory or a preset name
        points = parse_layers(args.layers, model_path)
        layer_ids, _arch = serving_ids(points, model_path)
    except (ServeError, LayerIdsError, ModelUnavailable) as exc:
        print(f"hsmon sglang-serve: {exc}", file=sys.stderr)
        return 2
    for flag in ("--enable-radix-cache", "--pp-size", "--model-path", "--port", "--host"):
        if _given(extra, flag):
            print(
                f"hsmon sglang-serve: {flag} after -- conflicts with what sglang-serve sets; "
                "use sglang-serve's own option or drop it",
                file=sys.stderr,
            )
            return 2
    refusal = dp_attention_refusal(extra) or port_refusal(args.host, args.port)
    if refusal:  # a taken port said before SGLang loads the model (it would fail after loading)
        print(f"hsmon sglang-serve: {refusal}", file=sys.stderr)
        return 2
    python = sglang_python(args.python)
    if os.sep in python and not Path(python).exists():
        print(f"hsmon sglang-serve: --python {python} does not exist (make sglang-env builds .sglang-venv)",
              file=sys.stderr)
        return 2
    if os.sep not in python and shutil.which(python) is None:
        print(f"hsmon sglang-serve: no {python!r} on PATH; pass --python /path/to/sglang-env/bin/python",
              file=sys.stderr)
        return 2
    cpu = on_cpu(args.device)
    try:
        speculative = plan(args.draft, args.draft_tokens, cpu, extra, model_path)
    except DraftError as exc:
        print(f"hsmon sglang-serve: {exc}", file=sys.stderr)
        return 2
    env = build_env(dict(os.environ), os.path.abspath(args.dump_dir), cpu)
    if cpu:
        bind_env(env, extra)  # one core group per rank: SGLang's CPU engine needs it past one NUMA node
    try:
        found = probe(python, env)
    except ServeError as exc:
        print(f"hsmon sglang-serve: {exc}", file=sys.stderr)
        return 2
    refusal = check_release(found, args.allow_untested_sglang, python_named(python, args.python is None))
    if refusal:
        print(f"hsmon sglang-serve: {refusal}", file=sys.stderr)
        return 2
    adapter = str(found["adapter"])
    print(f"hsmon sglang-serve: SGLang {found['sglang_version']}, capture adapter {adapter}"
          f"{'' if found.get('tested') else ' (untested release: --allow-untested-sglang)'}",
          file=sys.stderr, flush=True)
    if args.allow_untested_sglang:
        env["HSMON_PLUGIN_ALLOW_UNTESTED"] = "1"
    env["HSMON_PLUGIN_CAPTURE_POINTS"] = ",".join(str(p) for p in points)  # the plugin asks the class
    if adapter == WHOLE_PREFILL and _value(extra, "--chunked-prefill-size") != "-1":
        print(f"hsmon sglang-serve: SGLang {found['sglang_version']} drops the middle pieces of a chunked "
              "prefill before any hook: serve it with chunked prefill off, `hsmon sglang-serve ... -- "
              "--chunked-prefill-size -1`, or use SGLang 0.5.18 or later", file=sys.stderr)
        return 2
    if adapter == WHOLE_PREFILL and "SGLANG_GRPC_PORT" not in env and args.port + 10000 > 65535:
        # 0.5.14 puts its (unused, off) gRPC port at --port + 10000 and refuses to start past 65535
        env["SGLANG_GRPC_PORT"] = str(args.port - 10000)
    if adapter in (LAYER_CAPTURE, WHOLE_PREFILL) and not speculative.active:
        env["HSMON_PLUGIN_AUX_LAYER_IDS"] = ",".join(str(i) for i in layer_ids)
    cmd = build_command(python, str(model_path), points, args.host, args.port, cpu, extra, adapter,
                        nccl_port=None if _given(extra, "--nccl-port") else free_stable_port(args.host),
                        layer_ids=layer_ids, metrics=not args.no_metrics, speculative=speculative)
    print(f"hsmon sglang-serve: {plain_launch_line(cmd, env, dict(os.environ))}", file=sys.stderr, flush=True)
    return supervise(cmd, env, f"http://{args.host}:{args.port}", args.ready_timeout)

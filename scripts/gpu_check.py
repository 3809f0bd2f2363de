"""The SGLang capture path end to end on one machine, for scripts/gpu-check.sh (see docs/extract.md).

On an NVIDIA GPU (``--device cuda``): `hsmon sglang-serve` on SmolLM2 in bf16, the daemon with NVML
watching it, `hsmon extract --backend sglang --transport shm` over ``--rows`` chat rows at
``--concurrency``, `hsmon verify-data --backend hf` on a sample (bf16 tolerances), and the server's
tokens/s with and without capture on the same prompts (``bench/plugin_hook.py``'s batches).
On CPU (``--device cpu``, the fallback) the same steps on the embedded target in fp32 with small
sizes, so that the script itself is tested where there is no GPU. Prints one RESULT line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.plugin_hook import batch  # noqa: E402
from bench.sglang_transport import free_port  # noqa: E402
from extractor.sglang.supervise import stop_session  # noqa: E402

HSMON = [sys.executable, "-m", "hsmon"]


def chat_rows(path: Path, rows: int) -> None:
    """``rows`` ShareGPT-style conversations from the Python standard library's text."""
    from extractor.tiny_model import stdlib_text

    lines = [line for line in stdlib_text(200_000).splitlines() if line.strip()]
    rng = random.Random(21)
    with path.open("w") as fh:
        for _ in range(rows):
            start = rng.randrange(len(lines) - 40)
            answer = "\n".join(lines[start:start + rng.randint(8, 30)])
            fh.write(json.dumps({"conversations": [{"from": "human", "value": lines[start][:200]},
                                                   {"from": "gpt", "value": answer}]}) + "\n")


def start(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def wait_for_text(proc: subprocess.Popen, log: Path, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:]
            raise SystemExit(f"gpu-check: {log.name}: no {text!r}:\n{tail}")
        time.sleep(0.5)


def run(cmd: list[str], env: dict[str, str], what: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"gpu-check: {what} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def gpu_pids(daemon_port: int, server_pid: int) -> tuple[str, bool]:
    """The daemon's GPU panel: its one-line state, and whether it lists the server's processes."""
    import psutil

    with urllib.request.urlopen(f"http://127.0.0.1:{daemon_port}/api/v1/status", timeout=10) as resp:
        gpus = json.loads(resp.read()).get("gpus") or {}
    if not gpus.get("available"):
        return f"unavailable ({gpus.get('reason')})", False
    ours = {server_pid, *(p.pid for p in psutil.Process(server_pid).children(recursive=True))}
    listed = {p["pid"] for d in gpus.get("devices") or [] for p in d.get("processes") or []}
    return f"{len(gpus.get('devices') or [])} GPUs, PIDs {sorted(listed)}", bool(ours & listed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), required=True)
    parser.add_argument("--model", default=None, help="default: smollm2 on cuda, embedded on cpu")
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--sample", type=int, default=16)
    parser.add_argument("--tps-tokens", type=int, default=1024)
    parser.add_argument("--tps-requests", type=int, default=64)
    parser.add_argument("--work", required=True)
    parser.add_argument("--dump-root", required=True)
    args = parser.parse_args()
    from extractor.targets import resolve_model

    cuda = args.device == "cuda"
    model = resolve_model(args.model or ("smollm2" if cuda else "embedded"))
    dtype = "bfloat16" if cuda else "float32"
    work, dump_root = Path(args.work), Path(args.dump_root)
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    data = work / "chat.jsonl"
    chat_rows(data, args.rows)
    port, daemon_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    server = start([*HSMON, "sglang-serve", "--model-path", str(model), "--device", args.device, "--port",
                    str(port), "--dump-dir", str(dump_root), "--", "--dtype", dtype],
                   work / "server.log", env)
    daemon = None
    try:
        wait_for_text(server, work / "server.log", "ready at", 900)
        events = work / "events.jsonl"
        daemon = start([*HSMON, "daemon", "--job", "gpu-check", "--events", str(events), "--server", url,
                        "--port", str(daemon_port), "--dump-dir", str(dump_root / "job")],
                       work / "daemon.log", env)
        out = work / "sglang-out"
        run([*HSMON, "extract", str(data), "--out", str(out), "--model", str(model), "--backend", "sglang",
             "--url", url, "--transport", "shm", "--dump-dir", str(dump_root / "job"), "--concurrency",
             str(args.concurrency), "--dtype", dtype, "--events", str(events)], env, "hsmon extract")
        evs = [json.loads(line) for line in events.read_text().splitlines()]
        first = next(e for e in evs if e["kind"] == "start")
        done = next(e for e in evs if e["kind"] == "done")
        extract_tps = done["tokens_done"] / max(done["ts"] - first["ts"], 1e-9)
        verify = run([*HSMON, "verify-data", str(out), "--backend", "hf", "--model", str(model), "--sample",
                      str(args.sample), "--json"], env, "hsmon verify-data")
        verdict = json.loads(verify.stdout.strip().splitlines()[-1])["verdict"]
        job = dump_root / "tps"
        none_s, _ = batch(url, "none", args.tps_tokens, args.tps_requests, job, "gpu", args.concurrency)
        dump_s, _ = batch(url, "dump", args.tps_tokens, args.tps_requests, job, "gpu", args.concurrency)
        gpus, pids_seen = gpu_pids(daemon_port, server.pid)
    finally:
        stop_session(server)
        if daemon is not None:
            stop_session(daemon)
    tokens = args.tps_requests * args.tps_tokens
    ratio = none_s / dump_s
    print(f"gpu-check on {args.device}: {model.name} {dtype}; extract {args.rows} chat rows at concurrency "
          f"{args.concurrency}: {extract_tps:.0f} tokens/s; verify-data --backend hf: {verdict}")
    print(f"server tokens/s ({args.tps_requests} x {args.tps_tokens}-token prompts): no capture "
          f"{tokens / none_s:.0f}, dump {tokens / dump_s:.0f} ({ratio:.3f}x; GPU goal >= 0.95)")
    print(f"daemon GPU panel: {gpus}; server's PIDs listed: {pids_seen}")
    print(f"RESULT device={args.device} verdict={verdict} extract_tokens_s={extract_tps:.0f} "
          f"none_tokens_s={tokens / none_s:.0f} dump_tokens_s={tokens / dump_s:.0f} "
          f"dump_over_none={ratio:.3f} gpu_pids_seen={str(pids_seen).lower()}")
    return 0 if verdict == "agree" else 1


if __name__ == "__main__":
    raise SystemExit(main())

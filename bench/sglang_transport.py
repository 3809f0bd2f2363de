"""Hidden-state bytes per second into chunks, json against shm, on a real SGLang server on CPU.

    python bench/sglang_transport.py [--rows 8] [--tokens 1000] [--hidden 1024] [--repeats 2]

One `hsmon sglang-serve` server (a random Llama: 8 layers, hidden 1024, fp32, capture points
2,4,5) and real `hsmon extract --backend sglang` runs over the same pre-tokenized rows of
``--tokens`` tokens, alternating json and shm ``--repeats`` times; the best run of each counts.
Bytes/s: the hidden-state bytes written into chunks (rows x tokens x (K+1) x H x 4) over the
time from the run's `start` event to its `done` event (server start and model load excluded).

Client overhead (shm runs): the client's own time per row (decode the response, wait for,
check, load and delete the dump file) against the request's latency (send to response), as
`hsmon extract` reports on stderr when the sglang backend closes.

Goals: shm >= 5x json in bytes/s; client overhead <= 10 % of request time.
Ends with: RESULT json_mb_s=... shm_mb_s=... shm_over_json=... client_overhead_ratio=...
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LAYERS = (2, 4, 5)


def free_port() -> int:
    """A port for the server to bind later, outside the ephemeral range (extractor/sglang/ports.py)."""
    from extractor.sglang.ports import free_stable_port

    return free_stable_port()


def start_server(model: Path, dump_root: Path, log: Path, tokens: int) -> tuple[subprocess.Popen, str]:
    return start_sglang_serve(model, dump_root, log, LAYERS, ["--chunked-prefill-size", str(4 * tokens)])


def start_sglang_serve(model: Path, dump_root: Path, log: Path, layers: tuple[int, ...] | list[int],
                       sglang_args: list[str], python: str | None = None) -> tuple[subprocess.Popen, str]:
    """`hsmon sglang-serve` on CPU (float32) on a free port, ``sglang_args`` passed to SGLang, from
    the SGLang environment of ``python`` (default: sglang-serve's, .sglang-venv); returns once it
    says it is ready (the process, its URL)."""
    port = free_port()
    cmd = [sys.executable, "-m", "hsmon", "sglang-serve", "--model-path", str(model), "--port", str(port),
           "--dump-dir", str(dump_root), "--layers", ",".join(map(str, layers)), "--device", "cpu",
           *(["--python", python] if python else []), "--",
           "--dtype", "float32", *sglang_args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    deadline = time.monotonic() + 600
    while "ready at" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"sglang-serve did not start:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.5)
    return proc, f"http://127.0.0.1:{port}"


def stop_sglang_serve(server: subprocess.Popen) -> None:
    """Stop a server started by :func:`start_sglang_serve` (its whole process group)."""
    from extractor.sglang.supervise import stop_session

    stop_session(server)


def run_extract(data: Path, out: Path, model: Path, url: str, transport: str, dump: Path) -> dict[str, float]:
    events = out.with_suffix(".events.jsonl")
    cmd = [sys.executable, "-m", "hsmon", "extract", str(data), "--out", str(out), "--model", str(model),
           "--backend", "sglang", "--url", url, "--transport", transport, "--layers",
           ",".join(map(str, LAYERS)), "--min-free", "10M", "--events", str(events), "--batch-tokens",
           "100000"]
    if transport == "shm":
        cmd += ["--dump-dir", str(dump)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode != 0:
        raise SystemExit(f"hsmon extract --transport {transport} failed:\n{proc.stderr[-3000:]}")
    evs = [json.loads(line) for line in events.read_text().splitlines()]
    start = next(e for e in evs if e["kind"] == "start")
    done = next(e for e in evs if e["kind"] == "done")
    stats = re.search(r"request time ([\d.]+) s, client time ([\d.]+) s", proc.stderr)
    return {"seconds": done["ts"] - start["ts"], "tokens": done["tokens_done"],
            "request_s": float(stats.group(1)) if stats else float("nan"),
            "client_s": float(stats.group(2)) if stats else float("nan")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    from extractor.tiny_model import make_tiny_llama

    with tempfile.TemporaryDirectory(prefix="hsmon-bench-sglang-") as tmp, \
            tempfile.TemporaryDirectory(prefix="hsmon-bench-", dir="/dev/shm") as shm:
        scratch = Path(tmp)
        model = make_tiny_llama(scratch / "model", num_layers=8, hidden_size=args.hidden, vocab_size=512)
        rng = random.Random(0)
        data = scratch / "rows.jsonl"
        data.write_text("".join(json.dumps({"input_ids": [rng.randint(3, 500) for _ in range(args.tokens)]})
                                + "\n" for _ in range(args.rows)))
        dump_root = Path(shm)
        server, url = start_server(model, dump_root, scratch / "server.log", args.tokens)
        try:
            results: dict[str, list[dict[str, float]]] = {"json": [], "shm": []}
            for rep in range(args.repeats):
                for transport in ("json", "shm"):
                    out = scratch / f"{transport}-{rep}"
                    run = run_extract(data, out, model, url, transport, dump_root / "job")
                    results[transport].append(run)
                    r = results[transport][-1]
                    print(f"{transport} run {rep}: {r['seconds']:.2f} s for {r['tokens']} tokens "
                          f"(requests {r['request_s']:.2f} s, client {r['client_s']:.2f} s)", flush=True)
        finally:
            stop_sglang_serve(server)
    bytes_per_run = args.rows * args.tokens * (len(LAYERS) + 1) * args.hidden * 4
    best = {t: min(r["seconds"] for r in rs) for t, rs in results.items()}
    json_mb_s = bytes_per_run / best["json"] / 1e6
    shm_mb_s = bytes_per_run / best["shm"] / 1e6
    shm_runs = results["shm"]
    overhead = sum(r["client_s"] for r in shm_runs) / max(sum(r["request_s"] for r in shm_runs), 1e-9)
    json_overhead = (sum(r["client_s"] for r in results["json"])
                     / max(sum(r["request_s"] for r in results["json"]), 1e-9))
    print(f"model: random Llama, 8 layers, hidden {args.hidden}, fp32; {args.rows} rows x {args.tokens} "
          f"tokens; {bytes_per_run / 1e6:.0f} MB of hidden states per run")
    print(f"json: {json_mb_s:.1f} MB/s   shm: {shm_mb_s:.1f} MB/s   shm/json: {shm_mb_s / json_mb_s:.2f} "
          "(goal >= 5)")
    print(f"client overhead / request time: shm {overhead:.3f} (goal <= 0.10), json {json_overhead:.3f}")
    print(f"RESULT json_mb_s={json_mb_s:.1f} shm_mb_s={shm_mb_s:.1f} "
          f"shm_over_json={shm_mb_s / json_mb_s:.2f} client_overhead_ratio={overhead:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

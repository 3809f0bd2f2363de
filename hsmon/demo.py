"""`make demo`: extraction, daemon and dashboard together, on the embedded default target.

    python -m hsmon.demo [DIR] [--headless] [--interval SECONDS]

Runs a real `hsmon extract` on a sample dataset (the extraction demo's), a real `hsmon daemon`
watching it on a free loopback port with a fresh control token, and the TUI on that daemon. With
`--headless` (or when stdout is not a terminal, as in CI) it prints one status line per job every
few seconds instead, and exits 0 once the extraction is done and the daemon says so.

The torch side (building the target, writing the dataset) runs in a child process, so this
process, which hosts the TUI, never imports torch.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def prepare(base: Path) -> dict[str, Any]:
    """(In the child) the target model and the sample dataset, as the extraction demo makes them."""
    from extractor.demo import target_model, write_dataset

    base.mkdir(parents=True, exist_ok=True)
    model = target_model()
    data = base / "sample.jsonl"
    rows = write_dataset(data)
    return {"model": str(model), "data": str(data), "rows": rows}


def _stop(proc: subprocess.Popen[bytes] | None, name: str) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        print(f"demo: {name} did not stop on SIGTERM; killing it", file=sys.stderr)
        proc.kill()
        proc.wait()


def _status(url: str) -> dict[str, Any] | None:
    import requests

    try:
        return requests.get(f"{url}/api/v1/status", timeout=3).json()
    except (requests.RequestException, ValueError):
        return None


def headless(url: str, extraction: subprocess.Popen[bytes], interval: float) -> int:
    """Print status lines until the extraction ends and the daemon has seen how; the exit code."""
    from hsmon.tui.view import status_line

    started = time.monotonic()
    ended_at: float | None = None
    while True:
        document = _status(url)
        stamp = f"[{time.monotonic() - started:6.1f}s]"
        if document is None:
            print(f"{stamp} daemon at {url}: disconnected, retrying", flush=True)
        else:
            for job in document.get("jobs") or []:
                print(f"{stamp} {status_line(job)}", flush=True)
        if extraction.poll() is not None and ended_at is None:
            ended_at = time.monotonic()
        states = {job.get("state") for job in (document or {}).get("jobs") or []}
        if ended_at is not None and (states & {"done", "dead"} or time.monotonic() - ended_at > 15):
            ok = extraction.returncode == 0 and "done" in states
            print(
                f"{stamp} extraction exited {extraction.returncode}; the daemon says "
                f"{', '.join(sorted(s for s in states if s)) or 'nothing'}: {'OK' if ok else 'FAILED'}",
                flush=True,
            )
            return 0 if ok else 1
        time.sleep(interval)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hsmon.demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("dir", nargs="?", default="demo-out", help="working directory (default demo-out)")
    parser.add_argument("--headless", action="store_true", help="print status lines instead of the TUI")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between status lines (headless)")
    parser.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    base = Path(args.dir).resolve()
    if args.prepare:
        print(json.dumps(prepare(base)))
        return 0
    if args.interval <= 0:
        parser.error(f"--interval {args.interval}: must be a positive number of seconds")
    interactive = not args.headless and sys.stdout.isatty() and sys.stdin.isatty()

    base.mkdir(parents=True, exist_ok=True)
    print("demo: preparing the target and the sample dataset (first run builds the target) ...", flush=True)
    made = subprocess.run(
        [sys.executable, "-m", "hsmon.demo", "--prepare", str(base)], stdout=subprocess.PIPE, text=True
    )
    if made.returncode != 0:
        print("demo: preparing failed; see the messages above", file=sys.stderr)
        return 1
    setup = json.loads(made.stdout.strip().splitlines()[-1])
    out, events = base / "extract", base / "events.jsonl"
    shutil.rmtree(out, ignore_errors=True)
    events.unlink(missing_ok=True)
    token_file = base / "control-token"
    token = secrets.token_hex(16)
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    port_file = base / "daemon.port"
    port_file.unlink(missing_ok=True)

    extraction = daemon = None
    try:
        with open(base / "extract.log", "ab") as log:
            extraction = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "hsmon",
                    "extract",
                    setup["data"],
                    "--out",
                    str(out),
                    "--model",
                    setup["model"],
                    "--events",
                    str(events),
                    "--chunk-size",
                    "100",
                    "--min-free",
                    "100M",
                    "--heartbeat",
                    "1",
                ],
                stdout=log,
                stderr=log,
            )
        with open(base / "daemon.log", "ab") as log:
            daemon = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "hsmon",
                    "daemon",
                    "--job",
                    "extract",
                    "--kind",
                    "extract",
                    "--out",
                    str(out),
                    "--events",
                    str(events),
                    "--pid",
                    str(extraction.pid),
                    "--port",
                    "0",
                    "--port-file",
                    str(port_file),
                    "--control-token-file",
                    str(token_file),
                    "--scan-interval",
                    "1",
                ],
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + 30
        while not port_file.exists():
            if daemon.poll() is not None or time.monotonic() > deadline:
                print(f"demo: the daemon did not start; see {base / 'daemon.log'}", file=sys.stderr)
                return 1
            time.sleep(0.1)
        url = f"http://127.0.0.1:{int(port_file.read_text())}"
        print(f"demo: extraction pid {extraction.pid} ({setup['rows']} rows) -> {out}", flush=True)
        print(f"demo: daemon {url} (metrics {url}/metrics); logs in {base}", flush=True)
        if not interactive:
            return headless(url, extraction, args.interval)

        from hsmon.tui.app import HsmonApp
        from hsmon.tui.sources import HttpStatusSource

        os.environ.pop("COLUMNS", None)
        os.environ.pop("LINES", None)
        HsmonApp([HttpStatusSource(url, token=token)]).run()
        if extraction.poll() is None:
            print("demo: stopping the extraction (run `make demo` again to resume it)")
        return 0
    finally:
        _stop(extraction, "the extraction")
        _stop(daemon, "the daemon")


if __name__ == "__main__":
    raise SystemExit(main())

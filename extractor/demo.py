"""`make demo`: extract hidden states from the embedded target, watching the run live.

Builds (or loads) the embedded target, writes a sample dataset of a few hundred rows made from
Python's standard-library docstrings (plain text and question/answer conversations), runs a
real `hsmon extract` process, follows its event stream as a monitor would, and ends with a
summary. Output goes to ./demo-out (or the directory given as the first argument).
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from hsmon import events as ev
from hsmon.units import format_bytes

SOURCES = (
    "argparse.py",
    "textwrap.py",
    "shutil.py",
    "pathlib.py",
    "json/__init__.py",
    "csv.py",
    "difflib.py",
    "calendar.py",
    "string.py",
    "random.py",
    "statistics.py",
    "fractions.py",
    "heapq.py",
    "bisect.py",
    "functools.py",
    "inspect.py",
    "tempfile.py",
    "zipfile/__init__.py",
    "tarfile.py",
    "ipaddress.py",
)


def docstrings(limit: int, sources: tuple[str, ...] = SOURCES) -> list[tuple[str, str]]:
    """(name, docstring) pairs of standard-library functions and classes, from ``sources``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found: list[tuple[str, str]] = []
    for name in sources:
        path = root / name
        if not path.is_file():
            continue
        tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 40:
                    found.append((f"{path.stem}.{node.name}", doc[:1200]))
                    if len(found) >= limit:
                        return found
    return found


def write_dataset(path: Path, rows: int = 300) -> int:
    """A mixed dataset: text rows and ShareGPT conversations. Returns the row count."""
    pairs = docstrings(rows)
    with open(path, "w", encoding="utf-8") as fh:
        for i, (name, doc) in enumerate(pairs):
            if i % 2:
                row = {
                    "conversations": [
                        {"from": "human", "value": f"What does {name} do?"},
                        {"from": "gpt", "value": doc},
                    ]
                }
            else:
                row = {"text": doc}
            fh.write(json.dumps(row) + "\n")
    return len(pairs)


def target_model() -> Path:
    try:
        from extractor.embedded_target import ensure_embedded_target
    except ImportError:
        from extractor.tiny_model import make_tiny_llama

        print("(embedded target not in this build: using a small random Llama)")
        return make_tiny_llama(Path("demo-out") / "random-llama", num_layers=8, hidden_size=128)
    print("embedded target: building on first use (cached afterwards) ...", flush=True)
    return Path(ensure_embedded_target())


def follow(proc: subprocess.Popen[bytes], events_path: Path) -> dict | None:
    """Show the run's progress from its events until it ends; returns the last event."""
    reader = ev.EventFileReader(str(events_path))
    tty = sys.stdout.isatty()
    last, start, last_line = None, None, 0.0
    while True:
        for event in reader.poll():
            last = event
            kind = event["kind"]
            if kind == "start":
                start = event
                print(
                    f"start: {event['rows_total']} rows, {event['tokens_total']} tokens, "
                    f"{event['num_layers']} layers, hidden {event['hidden_size']}, "
                    f"capture points {event['layers']}, pid {event['pid']}"
                )
            elif kind in ("rows", "heartbeat") and start:
                done, total = event["rows_done"], max(event["rows_total"], 1)
                rate = event["tokens_done"] / max(event["ts"] - start["ts"], 1e-9)
                bar = "#" * int(30 * done / total)
                text = (
                    f"[{bar:<30}] {done}/{total} rows  {rate:,.0f} tok/s  {format_bytes(event['bytes_done'])}"
                )
                if tty:
                    print("\r" + text, end="", flush=True)
                elif time.monotonic() - last_line > 1.0:
                    print(text, flush=True)
                    last_line = time.monotonic()
            elif kind in ("chunk", "pause", "resume", "reject", "error"):
                detail = {k: v for k, v in event.items() if k not in ("v", "ts", "job", "kind", "sha256")}
                print(("\n" if tty else "") + f"{kind}: {detail}", flush=True)
        if proc.poll() is not None:
            for event in reader.poll():
                last = event
            if tty:
                print()
            return last
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    base = Path(argv[0] if argv else "demo-out")
    base.mkdir(parents=True, exist_ok=True)
    model = target_model()
    data = base / "sample.jsonl"
    rows = write_dataset(data)
    out = base / "extract"
    events_path = base / "events.jsonl"
    shutil.rmtree(out, ignore_errors=True)
    events_path.unlink(missing_ok=True)
    print(f"dataset: {data} ({rows} rows from standard-library docstrings)")
    cmd = [
        sys.executable,
        "-m",
        "hsmon",
        "extract",
        str(data),
        "--out",
        str(out),
        "--model",
        str(model),
        "--events",
        str(events_path),
        "--chunk-size",
        "100",
        "--min-free",
        "100M",
        "--heartbeat",
        "1",
    ]
    print("running:", " ".join(cmd[1:]), flush=True)
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=os.environ.copy())
    try:
        last = follow(proc, events_path)
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait()
        print("\ninterrupted: run `make demo` again to start over")
        return 130
    seconds = time.monotonic() - started
    if proc.returncode != 0 or not last or last["kind"] != "done":
        print(f"extraction failed (exit {proc.returncode}); see the messages above")
        return 1
    print("\nsummary")
    print(f"  rows     {last['rows_done']} ({last['rejects']} rejected)")
    print(f"  tokens   {last['tokens_done']}")
    print(f"  bytes    {format_bytes(last['bytes_done'])}")
    print(f"  seconds  {seconds:.1f} in all, {last['seconds']:.1f} extracting")
    print(f"  output   {out.resolve()}  (manifest: {out / 'hsmon-manifest.jsonl'}; events: {events_path})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

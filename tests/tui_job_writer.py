"""A real job for the TUI's end-to-end tests and its benchmark: writes progress events (the events contract)
and chunk records to a real output directory at a set rate, like an extraction does.

    python tests/tui_job_writer.py --out DIR --events FILE [--rows N] [--rate EVENTS_PER_S]
        [--chunk-size N] [--reject-every K] [--linger] [--job NAME]
"""

from __future__ import annotations

import argparse
import os
import time

from hsmon.contracts import layout
from hsmon.contracts.events import EventWriter

TOKENS_PER_ROW = 2100


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--events", required=True)
    parser.add_argument("--job", default="extract")
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=50.0, help="row events per second")
    parser.add_argument("--chunk-size", type=int, default=200)
    parser.add_argument("--reject-every", type=int, default=0)
    parser.add_argument("--linger", action="store_true", help="stay alive (no done event) after the rows")
    args = parser.parse_args()

    os.makedirs(args.out, exist_ok=True)
    manifest = os.path.join(args.out, layout.MANIFEST_NAME)
    chunks_total = -(-args.rows // args.chunk_size)
    layout.append_jsonl(manifest, [{"type": "run", "rows_total": args.rows, "pid": os.getpid()}])
    with EventWriter(args.job, args.events) as writer:
        writer.emit("start", rows_total=args.rows, tokens_total=args.rows * TOKENS_PER_ROW,
                    chunks_total=chunks_total, output_dir=args.out, pid=os.getpid(), backend="writer",
                    model="embedded")
        started = time.monotonic()
        last_heartbeat = started
        for row in range(args.rows):
            # Pace by the clock, so that the rate holds whatever each write costs.
            delay = started + row / args.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            if args.reject_every and row % args.reject_every == args.reject_every - 1:
                writer.emit("reject", row=row, reason="too long")
            writer.emit("row", row=row, rows_done=row + 1, tokens_done=(row + 1) * TOKENS_PER_ROW)
            if (row + 1) % args.chunk_size == 0 or row + 1 == args.rows:
                start = (row // args.chunk_size) * args.chunk_size
                name = layout.chunk_dir_name(start, start + args.chunk_size)
                rows = row + 1 - start
                layout.append_jsonl(manifest, [{"type": "chunk", "chunk": name, "rows": rows,
                                                "tokens": rows * TOKENS_PER_ROW, "bytes": rows * 1000}])
                writer.emit("chunk", chunk=name, rows=rows, bytes=rows * 1000)
            now = time.monotonic()
            if now - last_heartbeat >= 2:
                last_heartbeat = now
                writer.emit("heartbeat", rows_done=row + 1)
        if args.linger:
            while True:
                time.sleep(2)
                writer.emit("heartbeat", rows_done=args.rows)
        writer.emit("done", rows_done=args.rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

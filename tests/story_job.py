"""A real stand-in for the original job's extraction script (not hsmon extract): a "server" writes one
dump file per request into DUMP, the script packs each into OUT/rows_a-b/data_i.ckpt and deletes
the dump file, printing a line per row to stdout (block-buffered when stdout is a file and
python runs without -u). With --events it also writes hsmon progress events; with --manifest it
keeps an hsmon manifest (with --plan, starting with a ``run`` record that plans --rows rows).

    python tests/story_job.py DUMP OUT [--rows N] [--delay S] [--events FILE] [--manifest [--plan]]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from hsmon.contracts import events as ev
from hsmon.contracts import layout
from hsmon.contracts.manifest_reader import read_row_records


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("dump")
    parser.add_argument("out")
    parser.add_argument("--rows", type=int, default=0, help="0: forever")
    parser.add_argument("--delay", type=float, default=0.1)
    parser.add_argument("--row-bytes", type=int, default=4096)
    parser.add_argument("--chunk-size", type=int, default=20)
    parser.add_argument("--events")
    parser.add_argument("--manifest", action="store_true")
    parser.add_argument("--plan", action="store_true", help="with --manifest: a run record with rows_total")
    parser.add_argument("--job", default="story")
    args = parser.parse_args()
    os.makedirs(args.dump, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    writer = ev.EventWriter(args.job, args.events) if args.events else None
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    done = read_row_records(args.out) if args.manifest else {}
    if args.manifest and args.plan:
        layout.append_jsonl(
            os.path.join(args.out, layout.MANIFEST_NAME),
            [{"type": "run", "pid": os.getpid(), "started": time.time(), "rows_total": args.rows or None}],
        )
    if writer:
        writer.emit(ev.START, rows_total=args.rows or None, pid=os.getpid(), out=args.out)
    row = 0
    rows_done = len(done)
    tokens_done = sum(int(r.get("tokens", 0)) for r in done.values())
    while (args.rows == 0 or row < args.rows) and not stopping:
        if row in done:
            row += 1
            continue
        dump_file = os.path.join(args.dump, f"req_{row}")
        with open(dump_file, "wb") as fh:  # the "server" side
            fh.write(os.urandom(args.row_bytes))
        time.sleep(args.delay)
        with open(dump_file, "rb") as fh:
            payload = fh.read()
        final = layout.row_path(args.out, row, args.chunk_size)
        size = layout.atomic_write(final, lambda f, data=payload: f.write(data))
        os.unlink(dump_file)
        tokens = len(payload) // 16
        rows_done += 1
        tokens_done += tokens
        a, b = layout.chunk_bounds(row, args.chunk_size)
        if args.manifest:
            records = [
                {
                    "type": "row",
                    "row": row,
                    "chunk": layout.chunk_dir_name(a, b),
                    "tokens": tokens,
                    "bytes": size,
                    "sha256": "",
                }
            ]
            if row == b - 1:
                records.append({"type": "chunk", "chunk": layout.chunk_dir_name(a, b), "rows": b - a})
            layout.append_jsonl(os.path.join(args.out, layout.MANIFEST_NAME), records)
        print(f"packed row {row}: {size} bytes")  # the log the operator stares at
        if writer:
            writer.emit(ev.ROWS, rows_done=rows_done, tokens_done=tokens_done)
            if row == b - 1:
                writer.emit(ev.CHUNK, chunk=layout.chunk_dir_name(a, b), rows=b - a, bytes=size * (b - a))
        row += 1
    if writer:
        writer.emit(ev.STOPPED if stopping else ev.DONE, rows_done=rows_done, tokens_done=tokens_done)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One job of bench/soak.py: a synthetic writer of the project's own formats (no model, no GPU).

    python bench/_soak_writer.py EVENTS JOB ROWS SEED ROTATE [--out DIR] [--dump DIR]
                                 [--rate TOKENS_PER_S] [--row-bytes N]

- progress events (hsmon.contracts.events): ``start`` with the row and token plan, one ``rows``
  event a row (cumulative), a ``chunk`` event a chunk, ``done``; ROTATE (none, rename,
  copytruncate) rotates the events file halfway, as logrotate would;
- with ``--out``: the layout contract's output (hsmon.contracts.layout): a ``run`` record with
  the plan, one row file a row (written atomically), its ``row`` record, a ``chunk`` record a chunk, ``done``;
- with ``--dump``: the dump-dir churn of the original job's server: one file a row written into the dump
  directory (/dev/shm) before the row's work and consumed (deleted) after it.

Synthetic: a row's work is a sleep (bench/_soak_workload.py: ``--workload easy``, its token count,
200-4000, over ``--rate`` tokens/s +-30 %; ``real``, a real dataset's length mix from ``--lengths``,
a prefill that grows faster than the tokens and engine slowdowns); the row files hold
``--row-bytes`` random bytes, not hidden states.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time

from _soak_workload import RowTimes  # bench/ is on sys.path: python bench/_soak_writer.py

from hsmon.contracts import events as ev
from hsmon.contracts import layout

CHUNK = 20


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("events")
    p.add_argument("job")
    p.add_argument("rows", type=int)
    p.add_argument("seed", type=int)
    p.add_argument("rotate", choices=("none", "rename", "copytruncate"))
    p.add_argument("--out")
    p.add_argument("--dump")
    p.add_argument("--rate", type=float, default=10_500.0)
    p.add_argument("--row-bytes", type=int, default=1024)
    p.add_argument("--workload", choices=("easy", "real"), default="easy")
    p.add_argument("--lengths")
    a = p.parse_args()
    times = RowTimes(a.workload, a.rows, a.seed, a.rate, a.lengths)
    lengths = times.lengths
    chunks = (a.rows + CHUNK - 1) // CHUNK
    writer = ev.EventWriter(a.job, a.events)
    manifest = os.path.join(a.out, layout.MANIFEST_NAME) if a.out else None
    if manifest:
        os.makedirs(a.out, exist_ok=True)
        layout.append_jsonl(manifest, [{"type": "run", "pid": os.getpid(), "started": time.time(),
                                        "rows_done": 0, "tokens_done": 0, "rows_total": a.rows,
                                        "tokens_total": sum(lengths), "chunks_total": chunks,
                                        "bytes_needed": a.rows * a.row_bytes}])
    if a.dump:
        os.makedirs(a.dump, exist_ok=True)
    writer.emit(ev.START, pid=os.getpid(), rows_total=a.rows, tokens_total=sum(lengths), out=a.out)
    started, done, tokens = time.time(), 0, 0
    for i, n in enumerate(lengths):
        dump_file = os.path.join(a.dump, f"req_{i}") if a.dump else None
        if dump_file:
            with open(dump_file, "wb") as fh:  # the server's dump of the request
                fh.write(os.urandom(4096))
        time.sleep(times.seconds(n))
        if dump_file:
            os.unlink(dump_file)  # consumed
        done, tokens = done + 1, tokens + n
        if manifest:
            write_row(a.out, manifest, i, n, a.row_bytes, i == a.rows - 1)
        writer.emit(ev.ROWS, rows=1, tokens=n, rows_done=done, tokens_done=tokens)
        if (i + 1) % CHUNK == 0 or i == a.rows - 1:
            lo, hi = layout.chunk_bounds(i, CHUNK)
            writer.emit(ev.CHUNK, chunk=layout.chunk_dir_name(lo, hi), rows=i + 1 - lo)
        if i == a.rows // 2 and a.rotate != "none":
            writer = rotate(writer, a.events, a.rotate, a.job)
    if manifest:
        layout.append_jsonl(manifest, [{"type": "done", "ts": time.time(), "rows": done, "tokens": tokens,
                                        "bytes": done * a.row_bytes, "chunks": chunks, "rejects": 0,
                                        "seconds": time.time() - started}])
    writer.emit(ev.DONE, rows_done=done, tokens_done=tokens)


def write_row(out: str, manifest: str, row: int, tokens: int, size: int, last: bool) -> None:
    final = layout.row_path(out, row, CHUNK)
    nbytes = layout.atomic_write(final, lambda f: f.write(os.urandom(size)))
    lo, hi = layout.chunk_bounds(row, CHUNK)
    name = layout.chunk_dir_name(lo, hi)
    records = [{"type": "row", "row": row, "chunk": name, "tokens": tokens, "bytes": nbytes, "sha256": ""}]
    if row == hi - 1 or last:
        records.append({"type": "chunk", "chunk": name, "rows": row + 1 - lo, "rejects": 0})
    layout.append_jsonl(manifest, records)


def rotate(writer: ev.EventWriter, path: str, how: str, job: str) -> ev.EventWriter:
    """logrotate's two ways: rename + create (the writer reopens), or copy + truncate in place."""
    if how == "rename":
        writer.close()
        os.rename(path, path + ".1")
        return ev.EventWriter(job, path)
    shutil.copy(path, path + ".1")
    os.truncate(path, 0)
    return writer


if __name__ == "__main__":
    main()

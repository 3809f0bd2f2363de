"""What watching an online job costs against the two offline jobs it replaces (the goal:
the monitor's cost for an online job no more than for the two offline jobs it replaces).

Both sides get the same data and the same appends, and run in this one process, one after the
other, on the real Monitor (hsmon/core/monitor.py, its trackers from JOB_TRACKERS) and the real
/metrics collector:

- online: one job (kind extract) watching a spool: its manifest (a synthetic output of ``--rows``
  rows, tests/synthetic_output.py), the extractor's events, and, found in the spool itself, the
  limit file, the trainer's ledger and the trainer's events (hsmon/core/trackers/online.py);
- offline: the extraction job (the same manifest and events, no spool files) and the training job
  (kind train, the trainer's events), as a daemon watches them today.

Per round: 50 row records appended to the manifest (a chunk record per 2,000), a ``rows`` event,
a trainer ``step`` event; online also a ledger ``consumed`` record every 40 rounds (a chunk).
Then one tick and one /metrics render, timed in CPU seconds (time.process_time). The first
``--warmup`` rounds (the manifest's first read) are left out. Prints the median and mean CPU per
round of each and one RESULT line with the ratio online / offline (goal <= 1.0).

    .venv/bin/python bench/spool_watch.py                    # 100k rows, 300 rounds
    .venv/bin/python bench/spool_watch.py --rows 1000000     # a million-row spool
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from synthetic_output import row_record, write_synthetic_output  # noqa: E402

from hsmon.contracts import events as ev  # noqa: E402
from hsmon.contracts import layout, spool  # noqa: E402
from hsmon.core.config import JobConfig  # noqa: E402
from hsmon.core.monitor import Monitor  # noqa: E402
from hsmon.metrics.exporter import MetricsEndpoint  # noqa: E402

CHUNK = layout.DEFAULT_CHUNK_SIZE
PER_ROUND = 50


class Side:
    """One arrangement (online or offline): its directories, event writers and Monitor."""

    def __init__(self, root: Path, rows: int, online: bool) -> None:
        self.online, self.rows = online, rows
        self.out = root / ("spool" if online else "extracted")
        write_synthetic_output(self.out, rows, seed=1)
        self.rng = random.Random(2)
        self.extract_events = ev.EventWriter("extract", str(root / f"extract-{online}.jsonl"))
        self.extract_events.emit(ev.START, pid=os.getpid(), rows_total=rows * 10, out_dir=str(self.out))
        train_path = spool.train_events_path(self.out) if online else root / "train-events.jsonl"
        self.train_events = ev.EventWriter("train", str(train_path))
        self.train_events.emit(ev.START, pid=os.getpid(), total_steps=100_000)
        self.step = 0
        jobs = [JobConfig(name="extract", kind="extract", out_dir=str(self.out),
                          events=str(root / f"extract-{online}.jsonl"))]
        if online:
            spool.write_spool_limit(self.out, 20_000_000_000)
            layout.append_jsonl(spool.ledger_path(self.out), [
                {"type": "start", "ts": time.time(), "pid": os.getpid(), "passes": 1, "consume": True,
                 "step": 0}])
            self.consumed = 0
        else:
            jobs.append(JobConfig(name="train", kind="train", events=str(train_path)))
        self.monitor = Monitor(jobs, use_watchdog=False)
        self.metrics = MetricsEndpoint(self.monitor)

    def append(self, round_no: int) -> None:
        first = self.rows
        records = [row_record(i, CHUNK, self.rng, 600) for i in range(first, first + PER_ROUND)]
        self.rows += PER_ROUND
        if self.rows % CHUNK == 0:  # the chunk's record (its figures do not matter to the monitor)
            records.append({"type": "chunk", "chunk": layout.chunk_dir_name(self.rows - CHUNK, self.rows),
                            "rows": CHUNK, "rejects": 0, "tokens": 0, "bytes": 0, "sha256": "", "stats": {}})
        layout.append_jsonl(self.out / layout.MANIFEST_NAME, records, fsync=False)
        self.extract_events.emit(ev.ROWS, rows=PER_ROUND, rows_done=self.rows, tokens=PER_ROUND * 600)
        self.step += 1
        self.train_events.emit("step", step=self.step, loss=1.0, acc=0.5, tokens=4096 * self.step)
        if self.online and round_no % (CHUNK // PER_ROUND) == 0:
            name = layout.chunk_dir_name(self.consumed, self.consumed + CHUNK)
            self.consumed += CHUNK
            layout.append_jsonl(spool.ledger_path(self.out), [
                {"type": "trained", "ts": time.time(), "step": self.step, "rows": {}},
                {"type": "consumed", "ts": time.time(), "chunk": name, "rows": CHUNK, "bytes": 1}])

    def round(self, round_no: int) -> float:
        self.append(round_no)
        start = time.process_time()
        self.monitor.tick(force_scan=True)
        self.metrics.render()
        return time.process_time() - start

    def close(self) -> None:
        self.monitor.stop()
        self.extract_events.close()
        self.train_events.close()


def measure(root: Path, rows: int, rounds: int, warmup: int, online: bool) -> list[float]:
    side = Side(root, rows, online)
    try:
        times = [side.round(i) for i in range(rounds + warmup)]
        if online:
            (job,) = side.monitor.status().jobs
            assert job.online is not None and job.online.rows_consumed > 0, "the online job was not read"
        return times[warmup:]
    finally:
        side.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="rows in the spool at start")
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hsmon-spool-watch-") as tmp:
        root = Path(tmp)
        offline = measure(root, args.rows, args.rounds, args.warmup, online=False)
        online = measure(root, args.rows, args.rounds, args.warmup, online=True)
    med_on, med_off = statistics.median(online) * 1e3, statistics.median(offline) * 1e3
    mean_on, mean_off = statistics.fmean(online) * 1e3, statistics.fmean(offline) * 1e3
    print(f"{args.rows} rows at start, {args.rounds} rounds of {PER_ROUND} rows, a tick and a scrape each")
    print(f"offline (extraction job + training job): median {med_off:.2f} ms, mean {mean_off:.2f} ms "
          "CPU per round")
    print(f"online  (one job, both sides):           median {med_on:.2f} ms, mean {mean_on:.2f} ms "
          "CPU per round")
    print(f"RESULT rows={args.rows} rounds={args.rounds} online_ms={med_on:.3f} offline_ms={med_off:.3f} "
          f"ratio={med_on / med_off:.3f} mean_ratio={mean_on / mean_off:.3f} goal=<=1.0")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Online (extract and train at once through a spool) against offline (extract, then train).

Same data (the demo's sample: requests for standard-library functions answered with their
source, on the embedded target), same seed, same threads on each side (the extractor 1 torch
thread, the trainer 1: on a 2-core machine one core for each side), same optimizer steps (the
online run's S: it trains until every row had E passes, its schedule laid over the steps it
estimates from the extraction's plan; the offline one gets `--max-steps S`, laid over S), the
same `--batch-tokens` (sized so that the 10 % spool limit holds 4 full batches: the window never
caps the online batches, so both sides train about the same tokens; `tokens_ratio` shows it).

1. Offline: `hsmon extract` alone (timed); later `hsmon train --max-steps S` alone on the
   finished data (timed).
2. Online: the same extraction into a spool while `hsmon train SPOOL --follow --passes E --consume`
   trains (wall timed); a sampler reads the bytes of row files in the spool every 0.1 s (peak);
   `--spool-max` (10 % of the offline data's bytes, with chunks of a quarter of it) is passed when
   this build's extractor has it; otherwise the peak is what an unbounded spool reached.
3. Held-out acceptance: `hsmon eval-drafter` (depth 7) of both drafters on the demo's held-out
   prompts (functions of files neither the sample nor the target's corpus holds).
4. Faults: another online run in which the trainer is killed (-9) after its first checkpoint and
   the extractor killed (-9) after two chunks, each restarted (`--resume` for the trainer); the
   ledger then says how many training rows have fewer (lost) or more (extra) passes than E.

usage: python bench/online.py [--quick] [--rows N] [--passes E] [--keep DIR]
Last line: RESULT accept_online=... accept_offline=... accept_ratio=... peak_spool_mb=... limit_mb=...
           data_mb=... spool_peak_ratio=... overlap=... offline_ratio=... batch_tokens=... tokens_ratio=...
           rows_lost=... rows_extra=...
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hsmon.contracts import events as ev  # noqa: E402
from hsmon.contracts import layout, spool  # noqa: E402
from hsmon.contracts.manifest_reader import read_manifest  # noqa: E402

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
TRAIN = [
    "--lr",
    "2e-3",
    "--draft-vocab-size",
    "1024",
    "--threads",
    "1",
    "--seed",
    "0",
    "--heartbeat",
    "1",
    "--checkpoint-every",
    "20",
    "--eval-fraction",  # held-out rows stay in the spool: few of them (eval-drafter's prompts measure)
    "0.02",
]
CHUNK = 25
MAX_BATCH_TOKENS = 2048  # the demo's batch; smaller when the spool limit could not hold BATCHES_IN_LIMIT
BATCHES_IN_LIMIT = 4  # full batches the bounded spool (10 % of the data) must hold


def batch_tokens_for(data_tokens: int) -> int:
    """Tokens per batch, both sides: at most the demo's 2048, and small enough that a tenth of the
    data holds BATCHES_IN_LIMIT full batches, so the spool's window never caps the online batches
    (like with like: the same tokens in the same steps on both sides)."""
    return max(64, min(MAX_BATCH_TOKENS, data_tokens // 10 // BATCHES_IN_LIMIT))


def hsmon(*args: str) -> list[str]:
    return [sys.executable, "-m", "hsmon", *args]


def run(cmd: list[str], log: Path) -> float:
    """Run to the end (exit 0 required); returns the wall seconds."""
    started = time.monotonic()
    with open(log, "ab") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=fh, env=ENV, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"bench/online.py: {' '.join(cmd[2:5])} failed ({proc.returncode}); see {log}")
    return time.monotonic() - started


def start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=fh, env=ENV, cwd=ROOT)


def wait_ok(proc: subprocess.Popen[bytes], what: str, timeout: float = 3600) -> None:
    if proc.wait(timeout=timeout) != 0:
        raise SystemExit(f"bench/online.py: {what} failed ({proc.returncode})")


class SpoolWatch:
    """The peak bytes of row files in a spool, sampled every 0.1 s in a thread."""

    def __init__(self, path: Path) -> None:
        self.path, self.peak = path, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _bytes(self) -> int:
        total = 0
        try:
            for chunk in os.scandir(self.path):
                if chunk.is_dir() and chunk.name.startswith("rows_"):
                    for entry in os.scandir(chunk.path):
                        with contextlib.suppress(OSError):  # deleted meanwhile
                            total += entry.stat().st_size
        except OSError:
            return 0
        return total

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, self._bytes())

    def close(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def has_spool_max() -> bool:
    out = subprocess.run(hsmon("extract", "--help"), capture_output=True, text=True, env=ENV, cwd=ROOT)
    return "--spool-max" in out.stdout


def acceptance(drafter: Path, setup: dict[str, Any], prompts: int, new_tokens: int, log: Path) -> float:
    cmd = hsmon(
        "eval-drafter",
        "--drafter",
        str(drafter),
        "--target-model",
        setup["model"],
        "--prompts",
        setup["prompts"],
        "--depth",
        "7",
        "--max-new-tokens",
        str(new_tokens),
        "--max-prompts",
        str(prompts),
        "--threads",
        "1",
        "--json",
    )
    with open(log, "ab") as fh:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=fh, text=True, env=ENV, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"bench/online.py: eval-drafter failed; see {log}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["outputs_match_greedy"]
    return float(result["acceptance_length"]["eagle3"]["7"])


def last_event(path: Path, kind: str) -> dict[str, Any]:
    return next(e for e in reversed(list(ev.iter_events(path))) if e["kind"] == kind)


def wait_for(predicate: Any, timeout: float = 1800) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit("bench/online.py: timed out")
        time.sleep(0.05)


def ledger_errors(spool_dir: Path, passes: int) -> tuple[int, int, int]:
    """(rows with fewer passes than E, rows with more, training rows) per the ledger."""
    from trainer.window import HeldOut

    first = next(r for r in layout.iter_jsonl(spool.ledger_path(spool_dir)) if r.get("type") == "start")
    rule = HeldOut.from_record(first["heldout"])
    ledger = spool.read_ledger(spool_dir)
    rows = [r for r in read_manifest(spool_dir).rows if not rule.holds(r)]
    lost = sum(1 for r in rows if ledger.passes.get(r, 0) < passes)
    extra = sum(1 for r in rows if ledger.passes.get(r, 0) > passes)
    return lost, extra, len(rows)


def faults(
    base: Path, data: Path, setup: dict[str, Any], passes: int, train_args: list[str]
) -> tuple[int, int, int]:
    """An online run with one kill -9 of each side, each resumed; (lost, extra, rows) per the ledger."""
    sp, out = base / "fault-spool", base / "fault-drafter"
    extract = hsmon(
        "extract",
        str(data),
        "--out",
        str(sp),
        "--model",
        setup["model"],
        "--chunk-size",
        str(CHUNK),
        "--threads",
        "1",
        "--min-free",
        "10M",
        "--events",
        str(base / "fault-ext.jsonl"),
    )
    train = hsmon(
        "train",
        str(sp),
        "--follow",
        "--passes",
        str(passes),
        "--consume",
        "--out",
        str(out),
        "--target-model",
        setup["model"],
        *train_args,
        "--checkpoint-every",
        "3",
    )
    ext = start(extract, base / "fault-extract.log")
    trainer = start(train, base / "fault-train.log")
    ext_events, events = base / "fault-ext.jsonl", spool.train_events_path(sp)

    def chunks() -> int:
        return (
            sum(1 for e in ev.iter_events(ext_events) if e["kind"] == "chunk") if ext_events.exists() else 0
        )

    wait_for(lambda: ext.poll() is not None or chunks() >= 2)
    killed = ext.poll() is None
    if killed:
        ext.send_signal(signal.SIGKILL)
        ext.wait()
    wait_for(lambda: events.exists() and any(e["kind"] == "checkpoint" for e in ev.iter_events(events)))
    trainer.send_signal(signal.SIGKILL)
    trainer.wait()
    ext = start(extract, base / "fault-extract.log")
    trainer = start([*train, "--resume"], base / "fault-train.log")
    wait_ok(ext, "the resumed extraction")
    wait_ok(trainer, "the resumed trainer")
    print(
        f"faults: trainer killed -9 after its first checkpoint, extractor killed -9 "
        f"{'after two chunks' if killed else '(it had ended already)'}; both resumed",
        flush=True,
    )
    return ledger_errors(sp, passes)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="120 rows, E = 2, 2 eval prompts x 24 tokens")
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--passes", type=int, default=None)
    parser.add_argument("--keep", metavar="DIR", default=None, help="work here and keep it")
    args = parser.parse_args()
    rows = args.rows or (120 if args.quick else 300)
    passes = args.passes or (2 if args.quick else 4)
    prompts, new_tokens = (2, 24) if args.quick else (4, 32)
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="hsmon-online-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    from hsmon.demo.prepare import prepare

    setup = prepare(base / "prep", "embedded")
    data = base / "data.jsonl"
    data.write_text("".join(Path(setup["data"]).read_text().splitlines(keepends=True)[:rows]))
    ext_args = ["--model", setup["model"], "--chunk-size", str(CHUNK), "--threads", "1", "--min-free", "10M"]

    # 1. the extraction alone
    t_extract = run(
        hsmon("extract", str(data), "--out", str(base / "offline"), *ext_args), base / "offline.log"
    )
    manifest = read_manifest(base / "offline")
    data_bytes = manifest.bytes
    batch_tokens = batch_tokens_for(manifest.tokens)
    train_args = [*TRAIN, "--batch-tokens", str(batch_tokens)]
    print(
        f"offline: extraction {t_extract:.1f} s, data {data_bytes / 1e6:.1f} MB, {manifest.tokens} tokens: "
        f"batches of {batch_tokens} tokens on both sides ({BATCHES_IN_LIMIT} fit in 10 % of the data)",
        flush=True,
    )

    # 2. online: both at once, until every row had its E passes (a trainer ended early by
    # --max-steps would leave a bounded extractor waiting for room for ever)
    limit = data_bytes // 10
    limited = has_spool_max()
    # a chunk is the unit the trainer frees: a few of them (and the held-out rows) fit the limit
    chunk_rows = max(1, int(limit * 0.75 / (data_bytes / rows) / 3))
    sp = base / "spool"
    sp.mkdir()
    watch = SpoolWatch(sp)
    started = time.monotonic()
    spool_args = ["--spool-max", str(limit), "--chunk-size", str(chunk_rows)] if limited else []
    ext = start(hsmon("extract", str(data), "--out", str(sp), *ext_args, *spool_args), base / "online.log")
    follow = ["--follow", "--passes", str(passes), "--consume", "--out", str(base / "on-drafter")]
    trainer = start(
        hsmon("train", str(sp), *follow, "--target-model", setup["model"], *train_args), base / "online.log"
    )
    wait_ok(ext, "the online extraction")
    wait_ok(trainer, "the following trainer")
    t_online = time.monotonic() - started
    peak = watch.close()
    on_done = last_event(spool.train_events_path(sp), "done")
    steps = int(on_done["step"])
    lost0, extra0, trained = ledger_errors(sp, passes)
    enforced = "passed" if limited else "NOT enforced: this extractor has no --spool-max"
    print(
        f"online: {t_online:.1f} s wall ({steps} steps), peak spool {peak / 1e6:.1f} MB "
        f"(limit {limit / 1e6:.1f} MB {enforced}, chunks of {chunk_rows if limited else CHUNK} rows); "
        f"rows short of E at the end {lost0}, above {extra0} of {trained}",
        flush=True,
    )

    # 3. the training alone on the finished data, the same steps
    off_events = base / "offline-train.jsonl"
    t_train = run(
        hsmon("train", str(base / "offline"), "--max-steps", str(steps), "--out", str(base / "off-drafter"),
              "--target-model", setup["model"], "--events", str(off_events), *train_args),
        base / "offline.log",
    )  # fmt: skip
    tok_on, tok_off = int(on_done["tokens"]), int(last_event(off_events, "done")["tokens"])
    print(f"offline: training {t_train:.1f} s ({steps} steps); tokens trained online {tok_on}, "
          f"offline {tok_off}", flush=True)  # fmt: skip

    # 4. held-out acceptance
    acc_on = acceptance(base / "on-drafter", setup, prompts, new_tokens, base / "eval.log")
    acc_off = acceptance(base / "off-drafter", setup, prompts, new_tokens, base / "eval.log")
    # 5. faults
    lost, extra, fault_rows = faults(base, data, setup, passes, train_args)
    overlap = t_online / max(t_extract, t_train)
    print(
        f"RESULT accept_online={acc_on:.3f} accept_offline={acc_off:.3f} accept_ratio={acc_on / acc_off:.3f} "
        f"peak_spool_mb={peak / 1e6:.2f} limit_mb={limit / 1e6:.2f} data_mb={data_bytes / 1e6:.2f} "
        f"spool_peak_ratio={peak / max(limit, 1):.2f} limit_enforced={int(limited)} "
        f"overlap={overlap:.3f} offline_ratio={t_online / (t_extract + t_train):.3f} "
        f"online_s={t_online:.1f} extract_s={t_extract:.1f} train_s={t_train:.1f} steps={steps} "
        f"batch_tokens={batch_tokens} tokens_ratio={tok_on / max(tok_off, 1):.3f} "
        f"passes={passes} rows={rows} rows_lost={lost} rows_extra={extra} fault_rows={fault_rows} "
        f"threads=1+1",
        flush=True,
    )
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

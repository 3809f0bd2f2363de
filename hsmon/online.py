"""`hsmon online DATA.jsonl --out DIR`: extract and train at once, through a spool.

Starts real processes and waits for them: `hsmon extract DATA --out DIR/spool` (with
`--spool-max SIZE` when given and when this build's extractor has it), `hsmon train DIR/spool
--follow --passes E --consume --out DIR/drafter` and, with --daemon, `hsmon daemon` watching both
(DIR/hsmon.toml: one online job). The threads are split between the two sides (--extract-threads,
the rest to the trainer). Logs: DIR/extract.log, DIR/train.log, DIR/daemon.log; events:
DIR/extract-events.jsonl and DIR/spool/hsmon-train-events.jsonl. Either side failing stops the
other (SIGTERM: it checkpoints or records where it was; rerun the same command with --resume to go
on). A trainer that ends early (--max-steps, --time-limit) while the extraction waits for spool room
ends the run too: the extraction is stopped and the trainer's status returned. SIGINT or SIGTERM
stops both the same way. Exit status 0 when both ended well; 128 + the
signal's number (130 SIGINT, 143 SIGTERM) when a signal stopped the run before its work was done.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from hsmon.contracts import events as ev
from hsmon.contracts import layout, spool, stop_signals
from hsmon.online_progress import Progress, failure_line, summary_lines
from hsmon.status_doc.numbers import counted


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("data", metavar="DATA.jsonl", help="the dataset (as `hsmon extract` takes it: a "
                        "JSON Lines file, or a finished regeneration's --out)")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="DIR/spool (rows), DIR/drafter (training)")
    parser.add_argument("--model", metavar="DIR", default=None,
                        help="the target's Hugging Face directory (default: the embedded target)")
    parser.add_argument("--passes", type=int, default=1, metavar="E",
                        help="batches each row is in (default 1)")
    parser.add_argument("--keep", action="store_true", help="keep the rows (no --consume): the spool grows")
    parser.add_argument("--spool-max", metavar="SIZE", default=None,
                        help="pause the extraction while SIZE of rows wait for the trainer (e.g. 20GB; "
                             "needs an extractor with --spool-max)")
    parser.add_argument("--chunk-size", type=int, default=64, metavar="N",
                        help="rows per chunk, the unit the trainer reads and frees (default 64)")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="CPU threads in all (default: the CPUs this process may use)")
    parser.add_argument("--extract-threads", type=int, default=None, metavar="N",
                        help="of those, the extractor's (default half, at least 1; the trainer gets "
                             "the rest)")
    parser.add_argument("--daemon", action="store_true", help="also start `hsmon daemon` watching both sides")
    parser.add_argument("--progress-every", type=float, default=30.0, metavar="SECONDS",
                        help="without --daemon: a progress line per side every SECONDS (default 30; "
                             "on a terminal one line redrawn every second; 0: none)")
    parser.add_argument("--resume", action="store_true", help="resume both sides (after a kill or a stop)")
    parser.add_argument("--extract-arg", action="append", default=[], metavar="ARG",
                        help="one more argument for `hsmon extract` (repeatable, e.g. "
                             "--extract-arg=--max-length=512)")
    parser.add_argument("--regenerate", action="store_true",
                        help="first the target's own answers: `hsmon regenerate DATA --out DIR/regen`, then "
                             "extract and train on them (docs/regenerate.md)")
    parser.add_argument("--regenerate-arg", action="append", default=[], metavar="ARG",
                        help="one more argument for `hsmon regenerate` (repeatable, e.g. "
                             "--regenerate-arg=--max-new-tokens=512, or --backend sglang --url URL)")
    parser.add_argument("--train-arg", action="append", default=[], metavar="ARG",
                        help="one more argument for `hsmon train` (repeatable, e.g. --train-arg=--lr=2e-3)")


@dataclass
class Plan:
    """The commands `hsmon online` runs, and where each logs."""

    extract: list[str]
    train: list[str]
    spool_max_passed: bool
    extract_threads: int
    train_threads: int


def extractor_has_spool_max() -> bool:
    """Whether this build's `hsmon extract --help` lists --spool-max (the producer side of an online job)."""
    proc = subprocess.run([sys.executable, "-m", "hsmon", "extract", "--help"], capture_output=True,
                          text=True, timeout=120)
    return "--spool-max" in proc.stdout


def split_threads(total: int | None, extract: int | None) -> tuple[int, int]:
    """(extractor's, trainer's) threads: --extract-threads or half, at least 1 each."""
    if not total:
        total = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
    total = max(2, total)
    ext = extract if extract else max(1, total // 2)
    return ext, max(1, total - ext)


def make_plan(args: argparse.Namespace, spool_max_ok: bool) -> Plan:
    out = Path(args.out)
    ext_threads, train_threads = split_threads(args.threads, args.extract_threads)
    hs = [sys.executable, "-m", "hsmon"]
    extract = [*hs, "extract", args.data, "--out", str(out / "spool"), "--chunk-size", str(args.chunk_size),
               "--threads", str(ext_threads), "--events", str(out / "extract-events.jsonl")]
    if args.model:
        extract += ["--model", args.model]
    passed = bool(args.spool_max) and spool_max_ok
    if passed:
        extract += ["--spool-max", args.spool_max]
    extract += args.extract_arg
    train = [*hs, "train", str(out / "spool"), "--follow", "--passes", str(args.passes),
             "--out", str(out / "drafter"), "--threads", str(train_threads)]
    if not args.keep:
        train.append("--consume")
    if args.model:
        train += ["--target-model", args.model]
    if args.resume:
        train.append("--resume")
    train += args.train_arg
    return Plan(extract, train, passed, ext_threads, train_threads)


def daemon_config(out: Path, extract_pid: int | None, regenerate: bool = False) -> Path:
    """DIR/hsmon.toml: one online job, the extraction's; the daemon reads the following trainer from
    the spool itself (its ledger, events and PID: docs/daemon.md, "An online job"). With
    ``regenerate``, a regeneration job before it (started first: the extraction's PID is then
    read from its start event)."""
    from hsmon import online_regenerate as regen

    path = out / "hsmon.toml"
    jobs = []
    if regenerate:
        jobs.append(f'[[job]]\nname = "regenerate"\nkind = "regenerate"\n'
                    f"out_dir = {json.dumps(str(regen.regen_dir(out)))}\n"
                    f"events = {json.dumps(str(out / regen.EVENTS))}\n")
    pid = f"pid = {extract_pid}\n" if extract_pid is not None else ""
    jobs.append(f'[[job]]\nname = "online"\nkind = "extract"\nout_dir = {json.dumps(str(out / "spool"))}\n'
                f"events = {json.dumps(str(out / 'extract-events.jsonl'))}\n{pid}")
    path.write_text("\n".join(jobs))
    return path


# what a side that a signal stopped exits with (128 + SIGINT, 128 + SIGTERM): stopped, not failed
STOPPED_STATUSES = tuple(stop_signals.exit_status(s) for s in stop_signals.STOP_SIGNALS)


def _start(argv: list[str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(argv, stdout=log, stderr=log, env=env)


def _stop(proc: subprocess.Popen[bytes] | None, timeout: float = 60) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    refusal = data_refusal(Path(args.data))
    if refusal is not None:
        print(f"hsmon online: {refusal}", file=sys.stderr)
        return 2
    if args.passes < 1 or args.chunk_size < 1:
        print("hsmon online: --passes and --chunk-size must be positive", file=sys.stderr)
        return 2
    if args.keep and args.spool_max:
        # kept rows never leave the spool: once it holds --spool-max, the extraction waits for ever
        print(f"hsmon online: --keep with --spool-max {args.spool_max}: kept rows never free the spool, so "
              "the extraction would wait for ever once it is full; drop one of them", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    source = args.data
    if args.regenerate:
        from hsmon import online_regenerate

        args.data = str(online_regenerate.regen_dir(out))  # what the extraction reads once it is done
    plan = make_plan(args, extractor_has_spool_max() if args.spool_max else False)
    if args.spool_max and not plan.spool_max_passed:
        print("hsmon online: this hsmon extract has no --spool-max; the spool is not bounded",
              file=sys.stderr)
    extracting, training = counted(plan.extract_threads, "thread"), counted(plan.train_threads, "thread")
    print(f"hsmon online: extraction ({extracting}) -> {out / 'spool'}; following "
          f"training ({training}) -> {out / 'drafter'}; logs in {out}", flush=True)
    stop = {"signal": 0}

    def on_signal(signum: int, _frame: Any) -> None:
        stop["signal"] = signum

    previous = stop_signals.install(on_signal)  # SIGINT, SIGTERM, and SIGHUP (a lost terminal)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        with open(out / "extract.log", "ab") as elog, open(out / "train.log", "ab") as tlog:
            if args.daemon and args.regenerate:  # it watches the regeneration too
                procs["daemon"] = _spawn_daemon(out, procs, regenerate=True)
            if args.regenerate:
                status = _regenerate(args, source, out, plan, stop)
                if status is not None:
                    return status
            procs["extract"] = _start(plan.extract, elog)
            procs["train"] = _start(plan.train, tlog)
            if args.daemon and not args.regenerate:
                procs["daemon"] = _spawn_daemon(out, procs)
            progress = Progress(out, 0.0 if args.daemon else args.progress_every)
            return _wait(procs, stop, out, progress, args.model)
    finally:
        for name in ("train", "extract", "daemon"):
            _stop(procs.get(name))
        stop_signals.restore(previous)


def _spawn_daemon(out: Path, procs: dict[str, subprocess.Popen[bytes]],
                  regenerate: bool = False) -> subprocess.Popen[bytes]:
    from hsmon import daemon as daemon_process

    config = daemon_config(out, procs["extract"].pid if "extract" in procs else None, regenerate)
    with open(out / "daemon.log", "ab") as log:
        proc, url = daemon_process.spawn(["--config", str(config)], out / "daemon.port",
                                         stdout=log, stderr=log)
    print(f"hsmon online: daemon {url} (status {url}/api/v1/status, metrics {url}/metrics)", flush=True)
    return proc


def data_refusal(data: Path) -> str | None:
    """Why DATA cannot be this run's dataset (a missing file, an unfinished regeneration), or None."""
    from hsmon.contracts import regen_layout

    if data.is_dir() and regen_layout.is_regeneration(data):
        unfinished = regen_layout.unfinished_reason(data)
        return None if unfinished is None else (f"{data}: {unfinished}; finish it first (the same hsmon "
                                                "regenerate), or pass --regenerate with its dataset")
    if not data.is_file():
        return f"{data}: no such file; pass the dataset (JSON Lines) or a finished regeneration's --out"
    return None


def _regenerate(args: argparse.Namespace, data: str, out: Path, plan: Plan,
                stop: dict[str, int]) -> int | None:
    """The regeneration before both sides (hsmon/online_regenerate.py); None when its dataset is ready."""
    from hsmon import online_regenerate as regen

    if args.resume and regen.finished(out):
        print(f"hsmon online: the regeneration is done ({regen.regen_dir(out)}): not run again", flush=True)
        return None
    threads = plan.extract_threads  # the extraction's share: the in-process engines are alike
    argv = regen.regenerate_command(args, data, out, threads)
    print(f"hsmon online: regeneration ({counted(threads, 'thread')}) -> {regen.regen_dir(out)}; then "
          "extraction and training on the target's own answers", flush=True)
    return regen.run_regeneration(argv, out, stop, 0.0 if args.daemon else args.progress_every, _start, _stop)


def extractor_waits_for_room(events: Path) -> bool:
    """Whether the extraction's last pause or resume event is a pause for spool room."""
    waiting = False
    for event in layout.iter_jsonl(events):
        if event.get("kind") in (ev.PAUSE, ev.RESUME) and event.get("reason") == spool.PAUSE_SPOOL:
            waiting = event["kind"] == ev.PAUSE
    return waiting


def _wait(procs: dict[str, subprocess.Popen[bytes]], stop: dict[str, int], out: Path, progress: Progress,
          model: str | None) -> int:
    """Wait for both sides; a failed side (or a signal) stops the other. Returns the exit status."""
    extract, train = procs["extract"], procs["train"]
    while True:
        progress.tick()
        if stop["signal"] or extract.poll() is not None or train.poll() is not None:
            progress.end_line()
        if stop["signal"]:
            name = signal.Signals(stop["signal"]).name
            stop_signals.say(f"hsmon online: stopping both sides ({name}; resume with the same command and "
                             "--resume)")
            _stop(train)
            _stop(extract)
            return stop_signals.exit_status(stop["signal"])  # stopped, not done: no success for a script
        ext_rc, train_rc = extract.poll(), train.poll()
        for side, rc, other in (("extraction", ext_rc, train), ("training", train_rc, extract)):
            if rc in STOPPED_STATUSES:  # a side stopped by a signal someone sent it alone
                print(f"hsmon online: the {side} was stopped ({signal.Signals(rc - 128).name}); stopping the "
                      "other side (resume with the same command and --resume)", flush=True)
                _stop(other)
                return rc
        for side, rc, log, other, what in (("extraction", ext_rc, "extract.log", train, "training"),
                                           ("training", train_rc, "train.log", extract, "extraction")):
            if rc not in (None, 0):
                said = failure_line(out / log)
                print(f"hsmon online: the {side} failed (status {rc}): {said or 'no message'} "
                      f"(see {out / log}); stopping the {what}", file=sys.stderr)
                _stop(other)
                return 1
        if ext_rc == 0 and train_rc == 0:
            break
        if train_rc == 0 and ext_rc is None and extractor_waits_for_room(out / "extract-events.jsonl"):
            # the trainer ended early (--max-steps, --time-limit): nothing will make room any more
            ledger = spool.read_ledger(out / "spool")
            print(f"hsmon online: the training ended (status 0, {ledger.ended_reason or 'ended'} at step "
                  f"{ledger.step}) while the extraction waits for spool room that nothing will make; "
                  f"stopping the extraction. Go on with the same command and --resume (without the "
                  f"--max-steps or --time-limit that ended it); see {out / 'train.log'}", flush=True)
            _stop(extract)
            return train_rc
        time.sleep(0.2)
    print("\n".join(summary_lines(out, model)), flush=True)
    return 0

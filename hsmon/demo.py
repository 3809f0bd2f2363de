"""`make demo`: extraction, daemon, dashboard, drafter training and its acceptance, on the embedded
default target.

    python -m hsmon.demo [DIR] [--headless] [--no-train] [--train-seconds S] [--interval SECONDS]

1. A real `hsmon extract` on a sample dataset (the extraction demo's), watched by a real
   `hsmon daemon` on a free loopback port with a fresh control token, and the TUI on that daemon.
2. Once the daemon says the extraction is done: an EAGLE-3 drafter training, launched through the
   daemon's `POST /api/v1/train` with the token, exactly as the TUI's Launch button does (so it
   is a job the daemon and the TUI watch), time-boxed for a demo and on one torch thread.
3. Once it is done: `hsmon eval-drafter` on a few held-out prompts (docstrings of standard-library
   files neither the sample nor the target's corpus has), the drafter beside the n-gram drafter.
4. A summary: the extraction, the training, the acceptance lengths at depths 1 and 7.

With `--headless` (or when stdout is not a terminal, as in CI) it prints a status line per job
every few seconds instead of the TUI, and exits 0 when every step went through. `--no-train`
stops after the extraction. The torch side (building the target, writing the datasets, training,
evaluating) runs in child processes, so this process, which hosts the TUI, never imports torch.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hsmon import daemon as daemon_process

# Standard-library files that neither the sample dataset (extractor.demo.SOURCES) nor the embedded
# target's corpus (CRC-32 of the name = 0 mod 10 is held out there) contains: the eval's prompts.
HELD_OUT_SOURCES = ("copy.py", "glob.py", "hmac.py", "sched.py", "symtable.py", "modulefinder.py")
EVAL_PROMPTS = 4
EVAL_NEW_TOKENS = 32
EVAL_DEPTH = 7
# A short training that still learns something on the demo's few hundred rows: a higher learning
# rate and a smaller draft vocabulary than the defaults (see docs/train.md, "Measured").
TRAIN_FIELDS = {
    "epochs": "4",  # about 50 s on 2 cores; the time limit caps it on a slower machine
    "lr": "2e-3",
    "batch_tokens": "2048",
    "draft_vocab_size": "1024",
    "threads": "1",
}


def prepare(base: Path) -> dict[str, Any]:
    """(In the child) the target model, the sample dataset and the held-out eval prompts."""
    from extractor.demo import docstrings, target_model, write_dataset

    base.mkdir(parents=True, exist_ok=True)
    model = target_model()
    data = base / "sample.jsonl"
    rows = write_dataset(data)
    prompts = base / "heldout-prompts.jsonl"
    held = docstrings(EVAL_PROMPTS * 4, HELD_OUT_SOURCES)[::4][:EVAL_PROMPTS]
    with open(prompts, "w", encoding="utf-8") as fh:
        for _, doc in held:
            fh.write(json.dumps({"text": doc[:300]}) + "\n")
    return {
        "model": str(model),
        "data": str(data),
        "rows": rows,
        "prompts": str(prompts),
        "eval_prompts": len(held),
    }


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


def _job_state(url: str, name: str) -> str | None:
    for job in (_status(url) or {}).get("jobs") or []:
        if job.get("job") == name:
            return job.get("state")
    return None


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _events(path: Path) -> list[dict[str, Any]]:
    from hsmon import events as ev

    return list(ev.iter_events(path)) if path.is_file() else []


class Pipeline:
    """The steps after the start, in a thread: wait for the extraction, launch the training through
    the daemon, wait for it, evaluate. ``say`` reports progress; ``results`` feeds the summary."""

    def __init__(
        self,
        base: Path,
        url: str,
        token: str,
        setup: dict[str, Any],
        extraction: subprocess.Popen[bytes],
        train: bool,
        train_seconds: float,
        say: Callable[[str], None],
        on_launched: Callable[[str], None] = lambda job: None,
    ) -> None:
        self.base, self.url, self.token, self.setup = base, url, token, setup
        self.extraction, self.train, self.train_seconds = extraction, train, train_seconds
        self.say, self.on_launched = say, on_launched
        self.out, self.events = base / "extract", base / "events.jsonl"
        self.drafter = base / "drafter"
        self.phase = "extracting"
        self.phase_started = time.monotonic()
        self.results: dict[str, Any] = {}
        self.ok: bool | None = None
        self.train_pid: int | None = None
        self.eval_proc: subprocess.Popen[str] | None = None
        self.cancel = threading.Event()
        self.thread = threading.Thread(target=self._run_safely, name="demo-pipeline", daemon=True)

    def _phase(self, name: str) -> None:
        self.phase, self.phase_started = name, time.monotonic()

    def _run_safely(self) -> None:
        try:
            self.ok = self._run()
        except Exception as exc:  # reported, not raised: the thread's end is what the caller waits for
            self.say(f"demo: {type(exc).__name__}: {exc}")
            self.ok = False
        finally:
            self._phase("finished")

    def _wait_state(self, job: str, seconds: float = 15.0) -> str | None:
        """The daemon's state of ``job`` once terminal (done/dead), or the last one after ``seconds``."""
        deadline = time.monotonic() + seconds
        while True:  # read at least once: a TUI quit right after DONE still counts the extraction
            state = _job_state(self.url, job)
            if state in ("done", "dead") or time.monotonic() > deadline or self.cancel.wait(0.5):
                return state

    def _run(self) -> bool:
        started = time.monotonic()
        while self.extraction.poll() is None:
            if self.cancel.wait(0.5):
                # a TUI quit just after DONE: the extraction has said done and is exiting
                finishing = any(e["kind"] == "done" for e in _events(self.events))
                try:
                    self.extraction.wait(timeout=10 if finishing else 0)
                except subprocess.TimeoutExpired:
                    return False
        state = self._wait_state("extract")
        done = next((e for e in reversed(_events(self.events)) if e["kind"] == "done"), None)
        if done:
            self.results["extraction"] = {
                "rows": done["rows_done"],
                "rejects": done.get("rejects", 0),
                "tokens": done["tokens_done"],
                "bytes": done["bytes_done"],
                "seconds": done["seconds"],
                "wall_seconds": time.monotonic() - started,
                "output": str(self.out),
            }
        ok = self.extraction.returncode == 0 and state == "done" and done is not None
        self.say(
            f"extraction exited {self.extraction.returncode}; the daemon says {state or 'nothing'}: "
            f"{'OK' if ok else 'FAILED'}"
        )
        if not ok or not self.train or self.cancel.is_set():
            return ok
        return self._train() and self._evaluate()

    def _train(self) -> bool:
        from hsmon.tui.sources import HttpStatusSource

        self._phase("training")
        fields = {
            "data_dir": str(self.out),
            "out_dir": str(self.drafter),
            "target_model": self.setup["model"],
            "time_limit": f"{self.train_seconds:g}",
            **TRAIN_FIELDS,
        }
        launched = HttpStatusSource(self.url, token=self.token).launch_training(fields)
        if not launched.ok or not launched.job:
            errors = launched.errors or ""
            self.say(f"demo: the daemon did not launch the training: {launched.message} {errors}")
            return False
        job = launched.job
        pidfile = self.drafter / "train.pid"
        self.train_pid = int(pidfile.read_text()) if pidfile.is_file() else None
        self.say(f"demo: {launched.message} (PID {self.train_pid}, {self.train_seconds:g} s of steps)")
        self.on_launched(job)
        events = self.drafter / "events.jsonl"
        ends = ("done", "stopped", "error")
        while _alive(self.train_pid) and not any(e["kind"] in ends for e in _events(events)):
            if self.cancel.wait(1.0):
                return False
        state = self._wait_state(job)
        seen = _events(events)
        start = next((e for e in seen if e["kind"] == "start"), None)
        done = next((e for e in reversed(seen) if e["kind"] == "done"), None)
        if done is None or state != "done":
            log = self.drafter / "train.log"
            self.say(f"demo: the training ended without `done` (the daemon says {state}); see {log}")
            return False
        self.results["training"] = {
            "job": job,
            "steps": done["step"],
            "tokens": done["tokens"],
            "seconds": done["ts"] - start["ts"] if start else None,
            "accs": done.get("eval_accs") or [],
            "time_limit_reached": done.get("time_limit_reached"),
            "rows": start.get("rows") if start else None,
            "output": str(self.drafter),
        }
        self.say(f"training {job}: the daemon says done: OK")
        return True

    def _evaluate(self) -> bool:
        self._phase("evaluating")
        argv = [
            sys.executable, "-m", "hsmon", "eval-drafter",
            "--drafter", str(self.drafter),
            "--target-model", self.setup["model"],
            "--prompts", self.setup["prompts"],
            "--depth", str(EVAL_DEPTH),
            "--max-new-tokens", str(EVAL_NEW_TOKENS),
            "--max-prompts", str(EVAL_PROMPTS),
            "--threads", "1",
            "--json",
        ]  # fmt: skip
        count = self.setup["eval_prompts"]
        self.say(f"demo: hsmon eval-drafter on {count} held-out prompts, depths 1..{EVAL_DEPTH}")
        started = time.monotonic()
        with open(self.base / "eval.log", "ab") as log:
            self.eval_proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True)
            stdout, _ = self.eval_proc.communicate()
        if self.eval_proc.returncode != 0 or self.cancel.is_set():
            self.say(f"demo: eval-drafter exited {self.eval_proc.returncode}; see {self.base / 'eval.log'}")
            return False
        result = json.loads(stdout.strip().splitlines()[-1])
        self.results["acceptance"] = {**result, "seconds": time.monotonic() - started}
        (self.base / "acceptance.json").write_text(json.dumps(result, indent=1) + "\n")
        lengths = result["acceptance_length"]
        self.say(
            f"acceptance at depth {EVAL_DEPTH}: EAGLE-3 drafter {lengths['eagle3'][str(EVAL_DEPTH)]:.3f}, "
            f"n-gram {lengths['ngram'][str(EVAL_DEPTH)]:.3f} tokens per target forward"
        )
        return True

    def stop(self) -> None:
        """Cancel what is left: SIGTERM to a training still running (it checkpoints), end the eval."""
        from hsmon.launch import stop_job

        self.cancel.set()
        if _alive(self.train_pid) and self.phase == "training":
            stop_job(self.train_pid)  # type: ignore[arg-type]
            print(f"demo: stopped the training (PID {self.train_pid}; it writes a checkpoint first)")
        if self.eval_proc is not None and self.eval_proc.poll() is None:
            self.eval_proc.terminate()
        self.thread.join(timeout=20)


def summary(pipeline: Pipeline) -> list[str]:
    """The closing lines: what each step produced."""
    from hsmon.units import format_bytes

    lines = ["summary"]
    x = pipeline.results.get("extraction")
    if x:
        lines.append(
            f"  extraction  {x['rows']} rows ({x['rejects']} rejected), {x['tokens']:,} tokens, "
            f"{format_bytes(x['bytes'])}, {x['seconds']:.1f} s extracting -> {x['output']}"
        )
    t = pipeline.results.get("training")
    if t:
        seconds = f"{t['seconds']:.1f} s" if t["seconds"] is not None else "? s"
        accs = " ".join(f"{a:.2f}" for a in t["accs"]) or "none"
        lines.append(
            f"  training    {t['steps']} steps, {seconds}, {t['tokens']:,} tokens"
            f"{' (time limit reached)' if t['time_limit_reached'] else ''} -> {t['output']}"
        )
        lines.append(f"  held-out accuracy per unroll step  {accs}")
    a = pipeline.results.get("acceptance")
    if a:
        lengths = a["acceptance_length"]
        lines.append(
            f"  acceptance  tokens per target forward, {a['prompts']} held-out prompts x "
            f"{a['max_new_tokens']} new tokens, outputs equal greedy: "
            f"{'yes' if a['outputs_match_greedy'] else 'NO'} ({a['seconds']:.0f} s)"
        )
        for name, label in (("eagle3", "EAGLE-3 drafter"), ("ngram", "n-gram drafter ")):
            lines.append(
                f"    {label}  depth 1 {lengths[name]['1']:.3f}  "
                f"depth {EVAL_DEPTH} {lengths[name][str(EVAL_DEPTH)]:.3f}"
            )
    return lines


def headless(url: str, pipeline: Pipeline, interval: float, started: float) -> None:
    """Status lines (each job's, and the eval's) until the pipeline ends; stamps count from ``started``."""
    from hsmon.tui.view import status_line

    printed_done: set[str] = set()
    while True:
        finished = not pipeline.thread.is_alive()
        document = _status(url)
        stamp = f"[{time.monotonic() - started:6.1f}s]"
        if document is None:
            print(f"{stamp} daemon at {url}: disconnected, retrying", flush=True)
        else:
            for job in document.get("jobs") or []:
                name = str(job.get("job"))
                if name in printed_done and not finished:
                    continue  # a finished job's line once is enough while the next step runs
                if job.get("state") == "done":
                    printed_done.add(name)
                print(f"{stamp} {status_line(job)}", flush=True)
        if pipeline.phase == "evaluating":
            elapsed = time.monotonic() - pipeline.phase_started
            print(f"{stamp} eval-drafter: RUNNING  elapsed {elapsed:.0f}s", flush=True)
        if finished:
            return
        pipeline.thread.join(interval)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hsmon.demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("dir", nargs="?", default="demo-out", help="working directory (default demo-out)")
    parser.add_argument("--headless", action="store_true", help="print status lines instead of the TUI")
    parser.add_argument("--no-train", action="store_true", help="stop after the extraction")
    parser.add_argument(
        "--train-seconds", type=float, default=60.0, help="time limit of the training's steps (default 60)"
    )
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between status lines (headless)")
    parser.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    base = Path(args.dir).resolve()
    if args.prepare:
        print(json.dumps(prepare(base)))
        return 0
    if args.interval <= 0:
        parser.error(f"--interval {args.interval}: must be a positive number of seconds")
    if args.train_seconds < 1:
        parser.error(f"--train-seconds {args.train_seconds}: must be at least 1 second")
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
    shutil.rmtree(base / "drafter", ignore_errors=True)  # a fresh training, not a resumed one
    events.unlink(missing_ok=True)
    token_file = base / "control-token"
    token = secrets.token_hex(16)
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    port_file = base / "daemon.port"

    extraction = daemon = None
    pipeline: Pipeline | None = None
    try:
        with open(base / "extract.log", "ab") as log:
            extraction = subprocess.Popen(
                [
                    sys.executable, "-m", "hsmon", "extract", setup["data"],
                    "--out", str(out),
                    "--model", setup["model"],
                    "--events", str(events),
                    "--chunk-size", "100",
                    "--min-free", "100M",
                    "--heartbeat", "1",
                ],
                stdout=log,
                stderr=log,
            )  # fmt: skip
        try:
            with open(base / "daemon.log", "ab") as log:
                daemon, url = daemon_process.spawn(
                    [
                        "--job", "extract",
                        "--kind", "extract",
                        "--out", str(out),
                        "--events", str(events),
                        "--pid", str(extraction.pid),
                        "--control-token-file", str(token_file),
                        "--scan-interval", "1",
                    ],
                    port_file,
                    stdout=log,
                    stderr=log,
                )  # fmt: skip
        except daemon_process.DaemonStartError as exc:
            print(f"demo: {exc}; see {base / 'daemon.log'}", file=sys.stderr)
            return 1
        print(f"demo: extraction pid {extraction.pid} ({setup['rows']} rows) -> {out}", flush=True)
        print(f"demo: daemon {url} (metrics {url}/metrics); logs in {base}", flush=True)
        if not args.no_train:
            print(
                f"demo: then a drafter training through the daemon ({args.train_seconds:g} s of steps) "
                f"and hsmon eval-drafter on {setup['eval_prompts']} held-out prompts",
                flush=True,
            )
        started = time.monotonic()

        if not interactive:

            def say(text: str) -> None:
                print(f"[{time.monotonic() - started:6.1f}s] {text}", flush=True)

            pipeline = Pipeline(
                base, url, token, setup, extraction, not args.no_train, args.train_seconds, say
            )
            pipeline.thread.start()
            headless(url, pipeline, args.interval, started)
        else:
            from hsmon.tui.app import HsmonApp
            from hsmon.tui.sources import HttpStatusSource

            os.environ.pop("COLUMNS", None)
            os.environ.pop("LINES", None)
            app = HsmonApp([HttpStatusSource(url, token=token)])
            demo_log = base / "demo.log"

            def notify(text: str) -> None:
                with open(demo_log, "a") as fh:
                    fh.write(text + "\n")
                # RuntimeError: the app is not running (not started yet, or quit)
                with contextlib.suppress(RuntimeError):
                    app.call_from_thread(app.notify, text, title="demo", timeout=8)

            def follow_training(job: str) -> None:
                def show() -> None:
                    app.launched = (0, job)
                    app.switch_mode("training")

                with contextlib.suppress(RuntimeError):
                    app.call_from_thread(show)

            train = not args.no_train
            pipeline = Pipeline(
                base, url, token, setup, extraction, train, args.train_seconds, notify, follow_training
            )
            pipeline.thread.start()
            app.run()
            if pipeline.thread.is_alive():
                if extraction.poll() is None:
                    print("demo: stopping the extraction (run `make demo` again to start over)")
                pipeline.stop()
        for line in summary(pipeline):
            print(line, flush=True)
        ok = bool(pipeline.ok)
        verdict = "OK" if ok else "FAILED or interrupted"
        print(f"demo: {verdict} in {time.monotonic() - started:.0f} s", flush=True)
        return 0 if ok else 1
    finally:
        if pipeline is not None:
            pipeline.stop()
        _stop(extraction, "the extraction")
        _stop(daemon, "the daemon")


if __name__ == "__main__":
    raise SystemExit(main())
